"""`python -m tools.gpu_check`: the checks a borrowed GPU is for, in one command inside a time budget.

Steps (docs/gpu.md says how to prepare and run them), each skipped with its reason in the report
when it is not asked for, cannot run here, or no longer fits the budget:

  tests     `pytest -m gpu` with DRAFTGYM_TEST_DEVICE=<device>: the engine, lossless, timing,
            batched generation and the head forward on the device (tests/online/test_on_device.py)
  lossless  a random-weight target of Llama-3.1-8B's shape, built in bf16 directly on the GPU, and a
            random EAGLE-3 head of matching shape: EAGLE-3 output against AR output on random
            prompts at several tree shapes, classified exact / near-tie / mismatch
            (pipeline/decode/lossless.py). Random drafts are never accepted (tau = 1); the check
            is that the engine still emits exactly what AR emits
  latency   that target at batch 1 (tools/gpu_check/latency.py): the AR step, the verify phase of V
            tokens, one draft forward of width W, whole cycles of each tree shape; AR decode steps
            at batch B = 1..64; the batched EAGLE-3 engine where it exists
  profile   `draftgym profile` of that target on this GPU (tools/gpu_check/profile.py): batch 1 and
            every B of --profile-batch-sizes on the one engine's own steps, the prefill;
            comes back as gpu_profile.parquet, a normal latency profile for tune / serve-eval
  kernels   where the device time of the known slow GPU cases goes (tools/gpu_check/kernels.py):
            torch.profiler's top ops by self device and self CPU time, each slow case beside its
            fast twin
  validate  `draftgym validate` of the shipped head on the embedded SmolLM2 (tools/gpu_check/validate.py),
            when its weights were carried (`--smollm2`: a folder of parts from `tools.gpu_check.carry`, the
            GGUF, or a dequantised model folder), with the policies carried (`--policy`, e.g. the
            demo's LTD), else with static tree shapes only
  serving   every serving method under one load trace on SmolLM2 and the shipped head (
            tools/gpu_check/serving.py): collect, profile, tune, a trace, train-load, then
            `validate --load-trace` with the replay of the same trace beside each method

Outputs under --out (at most 8 files, none in subfolders: what a device call can bring back):
gpu_report.md (tables for BENCHMARKS.md), gpu_report.json (every number and the environment
fingerprint), tests.log, validate_report.md with its PNGs, gpu_profile.parquet, serving_report.md,
serving_profile.parquet. Both reports are rewritten after every
step, so a run stopped from outside still leaves what it had.

--dry-run runs every step at tiny size on the CPU (a tiny random Llama, pytest only collecting),
in well under a minute, so CI checks the script itself.
"""
from __future__ import annotations

import argparse
import gc
import shlex
import sys
import tempfile
import time
import tomllib
import traceback
from dataclasses import asdict, dataclass, field, replace
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from pipeline.cliargs import comma_list, parse_positive_ints
from pipeline.errors import DraftGymError, first_line

STEPS = ("tests", "lossless", "latency", "profile", "kernels", "validate", "serving")
ROOT = Path(__file__).resolve().parents[2]
_LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}
# meta-llama/Llama-3.1-8B-Instruct's config.json (the weights are random here)
LLAMA31_8B = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                  num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=131072,
                  rms_norm_eps=1e-5, rope_theta=500000.0, rope_scaling=_LLAMA3_ROPE, tie_word_embeddings=False)
TINY_LLAMA = dict(LLAMA31_8B, vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16384)
# the draft vocabulary of the published EAGLE-3 head for Llama-3.1-8B-Instruct
DRAFT_VOCAB = {"llama-3.1-8b": 32000, "tiny": 256}
# the share of the whole budget a step may take at most (validate and serving take what is left)
STEP_SHARE = {"tests": 0.2, "lossless": 0.2, "latency": 0.3, "profile": 0.3, "kernels": 0.1, "validate": 1.0, "serving": 1.0}
MIN_START_S = {"tests": 45, "lossless": 60, "latency": 60, "profile": 60, "kernels": 30, "validate": 90,
               "serving": 120}   # not worth starting with less
LAST = ("validate", "serving")               # these load SmolLM2: the big target is freed first
# what the check runs on: pyproject.toml's pins of these must hold here (the GPU image's own versions
# may be older, e.g. a transformers that ignores the forward's `cache=`: every result would be wrong)
RUNTIME_PACKAGES = ("torch", "transformers", "accelerate", "safetensors", "numpy", "pyarrow", "huggingface-hub")


@dataclass
class CheckConfig:
    """Every knob of the check (defaults: the real run on a GPU; `dry_run_sizes` shrinks them)."""

    out: str                                             # report folder
    minutes: float = 20.0                                # time budget for everything
    steps: tuple = STEPS
    dry_run: bool = False
    device: str = "cuda"
    dtype: str = "bfloat16"
    target: str = "llama-3.1-8b"                         # llama-3.1-8b | tiny
    shapes: tuple = ((8, 10, 60), (4, 10, 20), (5, 1, 6))   # static trees (D, W, V)
    prompts: int = 3                                     # lossless: random prompts (batch 1)
    prompt_lens: tuple = (32, 128, 512)                  # lossless: their lengths, in turn
    new_tokens: int = 48                                 # lossless: tokens per generation
    lossless_batch_sizes: tuple = (1, 4, 16, 64)         # lossless: the batched engine at these B
    lossless_batch_shapes: tuple = ((8, 10, 60), (5, 1, 6))
    lossless_batch_tokens: int = 24
    contexts: tuple = (128, 1024)                        # latency: context lengths
    verify_sizes: tuple = (1, 2, 4, 8, 16, 32, 60, 100, 160)
    widths: tuple = (1, 10)
    repeats: int = 10                                    # latency: timed calls per op (after 2 warm-ups)
    cycle_tokens: int = 32                               # latency: tokens per generation of its whole-cycle rows
    batch_sizes: tuple = (1, 2, 4, 8, 16, 32, 64)
    batch_steps: int = 16                                # decode steps timed per batch size
    collect_prompts: int = 8                             # latency: collection rate on this many prompts
    collect_tokens: int = 64                             # latency: ... of this many new tokens each
    profile_widths: tuple = (1, 10)                      # profile: draft widths (1: chains)
    profile_verify_sizes: tuple = (1, 2, 4, 8, 16, 32, 64)
    profile_contexts: tuple = (128, 1024)
    profile_batch_sizes: tuple = (1, 2, 4, 8, 16, 32, 64)
    profile_prefill_lengths: tuple = (128, 1024)
    profile_repeats: int = 5
    smollm2: str | None = None                           # validate: the carried SmolLM2 (see module docstring)
    policies: tuple = ()                                 # validate: policy checkpoint folders
    logs: str | None = None                              # validate: acceptance logs (grid-best, sim-vs-real)
    logs_dtype: str | None = None
    validate_sets: int = 2                               # validate: mt-bench, humaneval (those installed)
    validate_prompts: int = 5
    validate_new_tokens: int = 64
    serving_batch_sizes: tuple = (1, 2, 4, 8, 16)        # serving: profiled, tuned, the trace's loads; the largest = max batch
    serving_verify_sizes: tuple = (1, 2, 4, 8, 16, 32, 60)   # serving: V profiled at each B (60: the EAGLE-3 default tree validate serves)
    serving_context: int = 128                           # serving: the context profiled
    serving_prefill_lengths: tuple = (32, 64, 128, 256, 512)   # serving: prefill lengths profiled (cover the served prompts)
    serving_repeats: int = 3                             # serving: profile rounds
    serving_prompts: int = 12                            # serving: prompts collected and served (request k: prompt k mod N)
    serving_new_tokens: int = 64
    serving_requests_per_rate: int = 6                   # serving: the trace's requests per load level
    serving_runs: int = 3                                # serving: validate --runs
    serving_train_steps: int = 30000                     # serving: train-load's PPO steps (0: no learned policy)
    serving_train_reserve_s: float = 150.0               # serving: train only with this much of the step left
    work: str | None = None                              # scratch folder (default: a new temp folder)
    commit: str | None = None                            # the checkout's commit, where the tree travels without .git
    command: str = field(default_factory=lambda: " ".join(sys.argv))


def dry_run_sizes(cfg: CheckConfig) -> CheckConfig:
    """The same steps at tiny size on the CPU, in fp32 (the strict lossless rule)."""
    return replace(cfg, dry_run=True, device="cpu", dtype="float32", target="tiny", shapes=((8, 10, 60), (5, 1, 6)),
                   prompts=2, prompt_lens=(8, 16), new_tokens=8, lossless_batch_sizes=(1, 3), lossless_batch_tokens=6,
                   contexts=(8,), verify_sizes=(1, 4), widths=(2,),
                   repeats=2, cycle_tokens=6, batch_sizes=(1, 2), batch_steps=2, collect_prompts=2, collect_tokens=4, profile_widths=(1, 2),
                   profile_verify_sizes=(1, 4), profile_contexts=(8,), profile_batch_sizes=(1, 2),
                   profile_prefill_lengths=(8,), profile_repeats=2, validate_sets=1, validate_prompts=1,
                   validate_new_tokens=4, serving_batch_sizes=(1, 2), serving_verify_sizes=(1, 2), serving_context=8,
                   serving_prefill_lengths=(8,),
                   serving_repeats=1, serving_prompts=2, serving_new_tokens=4, serving_requests_per_rate=2, serving_runs=1,
                   serving_train_steps=64, serving_train_reserve_s=0.0)


class Budget:
    """Seconds left of the whole run, and of one step's share of it."""

    def __init__(self, seconds: float, steps=STEPS):
        self.t0, self.seconds = time.perf_counter(), seconds
        # without validate or serving (which take what is left), the shares of the steps asked for fill the budget
        total = sum(STEP_SHARE[s] for s in steps)
        self.share = dict(STEP_SHARE) if set(LAST) & set(steps) else {s: STEP_SHARE[s] / total for s in steps}

    def left(self) -> float:
        return self.seconds - (time.perf_counter() - self.t0)

    def step_deadline(self, step: str) -> float:
        """perf_counter time by which `step` must stop starting new work."""
        return time.perf_counter() + min(self.left(), self.share.get(step, STEP_SHARE[step]) * self.seconds)


def _torch_dtype(name: str):
    import torch

    from pipeline.models.target import DTYPE_NAMES
    return DTYPE_NAMES[name] if name in DTYPE_NAMES else getattr(torch, name)


def unmet_requirements(installed=None) -> list[str]:
    """pyproject.toml's requirements on RUNTIME_PACKAGES that this interpreter does not meet.
    installed(name) -> version string (default: importlib.metadata.version)."""
    from packaging.requirements import Requirement

    installed = installed or version
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    out = []
    for req in map(Requirement, deps):
        if req.name.lower().replace("_", "-") not in RUNTIME_PACKAGES:
            continue
        try:
            have = installed(req.name)
        except PackageNotFoundError:
            have = None
        if have is None or not req.specifier.contains(have, prereleases=True):
            out.append(f"{req.name} {have or 'missing'} (pyproject.toml: {req})")
    return out


# -- the random target and head (steps 2 and 3) ----------------------------------------------------

def build_target(cfg: CheckConfig):
    """A random-weight Llama of the configured shape, created and initialised on the device itself
    (8B parameters initialised on a CPU would take minutes), eval mode, no gradients."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    shape = LLAMA31_8B if cfg.target == "llama-3.1-8b" else TINY_LLAMA
    conf = LlamaConfig(**shape, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    dev = torch.device(cfg.device)
    if dev.type == "cuda":
        need = sum(_param_count(shape)) * 2.2           # bf16 weights + room for activations and caches
        free = torch.cuda.mem_get_info(dev)[0]
        if free < need:
            raise DraftGymError(f"{cfg.target} target needs ~{need / 2**30:.0f} GiB on {dev}, {free / 2**30:.0f} GiB free")
    torch.manual_seed(0)
    with dev:
        model = AutoModelForCausalLM.from_config(conf, dtype=_torch_dtype(cfg.dtype))
    return model.eval().requires_grad_(False)


def _param_count(s: dict) -> tuple[int, int]:
    """(embedding + lm_head, decoder layers) parameter counts of a Llama shape."""
    H, I, L = s["hidden_size"], s["intermediate_size"], s["num_hidden_layers"]
    kv = H // s["num_attention_heads"] * s["num_key_value_heads"]
    return 2 * s["vocab_size"] * H, L * (2 * H * H + 2 * H * kv + 3 * H * I)


def build_head(cfg: CheckConfig, model):
    from pipeline.models.head import random_head

    return random_head(model, draft_vocab_size=DRAFT_VOCAB[cfg.target], seed=0)


# -- step 2: lossless at several tree shapes -------------------------------------------------------

# -- the run ---------------------------------------------------------------------------------------

def run_check(cfg: CheckConfig) -> dict:
    """Every asked-for step in order, within the budget; the reports rewritten after each step."""
    import torch

    from tools.gpu_check.kernels import kernel_traces
    from tools.gpu_check.lossless import check_lossless
    from tools.gpu_check.latency import profile_latency
    from tools.gpu_check.profile import gpu_profile
    from tools.gpu_check.report import write_reports
    from tools.gpu_check.pytest_step import run_tests
    from tools.gpu_check.serving import run_serving_step
    from tools.gpu_check.validate import run_validate_step
    from pipeline.runtime.fingerprint import environment_fingerprint

    unknown = [s for s in cfg.steps if s not in STEPS]
    if unknown:
        raise DraftGymError(f"unknown step {unknown[0]!r} (steps: {', '.join(STEPS)})")
    unmet = unmet_requirements()
    if unmet:
        raise DraftGymError(f"this interpreter does not meet the checkout's requirements: {'; '.join(unmet)}; "
                            f"carry the wheels (docs/gpu.md)")
    dev = torch.device(cfg.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise DraftGymError("no CUDA device here: run on a GPU machine (docs/gpu.md), or pass --dry-run")
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(cfg.work or tempfile.mkdtemp(prefix="gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    budget = Budget(cfg.minutes * 60, cfg.steps)
    report = {"format": "draftgym-gpu-check/1", "run_id": time.strftime("%Y%m%d-%H%M%S"), "config": asdict(cfg),
              "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else None,
              "environment": environment_fingerprint(dev, cfg.dtype), "steps": {}}
    if cfg.commit:              # named by the caller: it wins over a checkout the device machine may hold (log 2026-11-28)
        report["environment"]["draftgym_commit"] = cfg.commit
    state: dict = {}

    def model_and_head():
        if "model" not in state:
            t0 = time.perf_counter()
            state["model"] = build_target(cfg)
            state["head"] = build_head(cfg, state["model"])
            report["target_build_s"] = time.perf_counter() - t0
        return state["model"], state["head"]

    runners = {
        "tests": lambda dl: run_tests(cfg, dl, out),
        "lossless": lambda dl: check_lossless(cfg, dl, *model_and_head()),
        "latency": lambda dl: profile_latency(cfg, dl, *model_and_head()),
        "profile": lambda dl: gpu_profile(cfg, dl, *model_and_head(), work, out),
        "kernels": lambda dl: kernel_traces(cfg, dl, *model_and_head()),
        "validate": lambda dl: run_validate_step(cfg, work, out, TINY_LLAMA),
        "serving": lambda dl: run_serving_step(cfg, dl, work, out, TINY_LLAMA),
    }
    for step in STEPS:
        t0 = time.perf_counter()
        if step not in cfg.steps:
            res = {"status": "skipped", "reason": "not asked for (--steps)"}
        elif budget.left() <= (need := 0 if cfg.dry_run else MIN_START_S[step]):
            res = {"status": "skipped", "reason": f"time budget: {max(budget.left(), 0):.0f} s left, "
                                                  f"the step needs at least {need} s"}
        else:
            if step in LAST:                            # free the big target first
                state.clear()
                gc.collect()
                if dev.type == "cuda":
                    torch.cuda.empty_cache()
            try:
                res = runners[step](budget.step_deadline(step))
            except Exception as e:                      # one broken step must not lose the others
                res = {"status": "failed", "reason": f"{type(e).__name__}: {first_line(e)}",
                       "traceback": traceback.format_exc()[-4000:]}
        res["wall_s"] = time.perf_counter() - t0
        report["steps"][step] = res
        report["wall_s"] = budget.seconds - budget.left()
        write_reports(report, out)
        print(f"gpu_check: {step}: {res['status']}" + (f" ({res['reason']})" if res.get("reason") else "")
              + f" [{res['wall_s']:.0f} s]", flush=True)
    return report


def parse_shapes(s: str) -> tuple:
    """'8,10,60:4,10,20' -> ((8, 10, 60), (4, 10, 20))."""
    shapes = tuple(parse_positive_ints(x, "--shapes") for x in s.split(":") if x.strip())
    if not shapes or any(len(x) != 3 for x in shapes):
        raise DraftGymError(f"--shapes takes D,W,V triples separated by ':', got {s!r}")
    return shapes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.gpu_check", description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="report folder (gpu_report.md, gpu_report.json, tests.log, ...)")
    ap.add_argument("--minutes", type=float, default=20.0, help="time budget; steps that no longer fit are skipped")
    ap.add_argument("--steps", default=",".join(STEPS), help="which steps, comma-separated")
    ap.add_argument("--dry-run", action="store_true", help="every step at tiny size on the CPU (under a minute)")
    ap.add_argument("--device", default=None, help="default: cuda (cpu with --dry-run)")
    ap.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                    help="default: bfloat16 (float32 with --dry-run)")
    ap.add_argument("--shapes", default=None,
                    help="static trees D,W,V separated by ':' (default 8,10,60:4,10,20:5,1,6; dry run 8,10,60:5,1,6)")
    ap.add_argument("--prompts", type=int, default=None, help="lossless: random prompts (default 3)")
    ap.add_argument("--contexts", default=None, help="latency: context lengths (default 128,1024)")
    ap.add_argument("--batch-sizes", default=None, help="latency: batch sizes (default 1,2,4,8,16,32,64)")
    ap.add_argument("--profile-batch-sizes", default=None,
                    help="profile: batch sizes of the GPU latency profile (default 1,2,4,8,16,32,64)")
    ap.add_argument("--profile-contexts", default=None, help="profile: its context lengths (default 128,1024)")
    ap.add_argument("--lossless-batch-sizes", default=None,
                    help="lossless: the batched engine at these batch sizes, largest first (default 1,4,16,64)")
    ap.add_argument("--smollm2", default=None,
                    help="validate: carried SmolLM2 (a folder of tools.gpu_check.carry parts, the .gguf, or a dequantised model folder)")
    ap.add_argument("--policy", action="append", default=[], help="validate: a policy checkpoint folder (repeatable)")
    ap.add_argument("--logs", default=None, help="validate: acceptance logs for grid-best and sim-vs-real")
    ap.add_argument("--logs-dtype", default=None, help="validate: the logs' dtype when not --dtype")
    ap.add_argument("--serving-batch-sizes", default=None,
                    help="serving: batch sizes profiled, tuned and loaded by the trace; the largest is the max batch (default 1,2,4,8,16)")
    ap.add_argument("--serving-runs", type=int, default=None, help="serving: validate --load-trace runs (default 3)")
    ap.add_argument("--serving-train-steps", type=int, default=None,
                    help="serving: train-load's steps for the learned load-aware policy, 0 = none (default 30000)")
    ap.add_argument("--work", default=None, help="scratch folder (default: a new temp folder)")
    ap.add_argument("--commit", default=None,
                    help="the commit to record where the working tree travelled without .git (default: git's answer)")
    args = ap.parse_args(argv)
    try:
        cfg = CheckConfig(out=args.out, minutes=args.minutes, steps=comma_list(args.steps),
                          smollm2=args.smollm2, policies=tuple(args.policy),
                          logs=args.logs, logs_dtype=args.logs_dtype, work=args.work, commit=args.commit,
                          command="python -m tools.gpu_check " + shlex.join(sys.argv[1:] if argv is None else argv))
        if args.dry_run:
            cfg = dry_run_sizes(cfg)
        over = {"device": args.device, "dtype": args.dtype, "prompts": args.prompts,
                "shapes": args.shapes and parse_shapes(args.shapes),
                "contexts": args.contexts and parse_positive_ints(args.contexts, "--contexts"),
                "batch_sizes": args.batch_sizes and parse_positive_ints(args.batch_sizes, "--batch-sizes"),
                "lossless_batch_sizes": args.lossless_batch_sizes
                and parse_positive_ints(args.lossless_batch_sizes, "--lossless-batch-sizes"),
                "profile_batch_sizes": args.profile_batch_sizes
                and parse_positive_ints(args.profile_batch_sizes, "--profile-batch-sizes"),
                "profile_contexts": args.profile_contexts and parse_positive_ints(args.profile_contexts, "--profile-contexts"),
                "serving_batch_sizes": args.serving_batch_sizes
                and parse_positive_ints(args.serving_batch_sizes, "--serving-batch-sizes"),
                "serving_runs": args.serving_runs, "serving_train_steps": args.serving_train_steps}
        cfg = replace(cfg, **{k: v for k, v in over.items() if v is not None})
        if cfg.minutes <= 0:
            raise DraftGymError(f"--minutes must be > 0, got {cfg.minutes}")
        if cfg.serving_runs < 1 or cfg.serving_train_steps < 0:
            raise DraftGymError(f"--serving-runs must be >= 1 and --serving-train-steps >= 0, got "
                                f"{cfg.serving_runs} and {cfg.serving_train_steps}")
        report = run_check(cfg)
    except DraftGymError as e:
        print(f"draftgym: error: {e}", file=sys.stderr)
        return 2
    print(f"report: {Path(cfg.out) / 'gpu_report.md'}")
    return 1 if any(s["status"] == "failed" for s in report["steps"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
