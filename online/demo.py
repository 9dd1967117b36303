"""`make demo`: the whole DraftGym loop on the embedded default, on whatever device is here.

    collect   (Ray job)  per-position draft trees + acceptance tables, train and test prompts
    profile              this device's draft / verify / policy / overhead latency
    train                an LTD policy (depth + size PPO) in the replay simulator
    profile-policy       what one call of that policy costs inside the engine (joins the profile)
    evaluate             policies and baselines replayed on held-out prompts
    validate             the policy in the loop on the real device: speedup, lossless, sim-vs-real
                         (--profile-first: re-profiled right before decoding, and --profile-interleave:
                         once more between the generations, so the simulator's prediction is timed on
                         the machine states the decoding actually saw)
  and, for serving at load (--batch-sizes; docs/serving.md):
    profile              the batched engine's step costs at B = 1, 4, 16 (small trees: what pays at B > 1)
    tune                 the best shape at each B in replay, merged into a schedule, and its headroom
    export               that schedule as vLLM's speculative_config (the best chain where a tree won)
    vllm-run             that config in the real vLLM engine (when `make vllm` has installed it; --no-vllm
                         skips it), beside no speculation and chains of 1 and 2 at B = 1 and 4: lossless,
                         acceptance and tokens/s against the replay of the same prompts (docs/vllm.md)

Each step is the `draftgym` command printed before it runs; every step resumes or overwrites, so
running the demo twice is safe, and each step prints its own time. Sizes aim at 15 minutes on a 2-core CPU.
LTD training is the one step whose cost a size alone sets, about linear in PPO steps (100k steps per
phase take 217-279 s for its 4 phases in fp32 on a 2-core AVX2 EPYC), so each phase runs 60k. Profiling
(the profile step, then validate's --profile-first and --profile-interleave rounds) is the largest
share of the time, so each round measures 2 contexts and 9 verify sizes: below 512 tokens the CPU's
verify cost moves less with c than between two rounds of the same cell, and from V = 60 up it is
linear in V, so the sizes between are interpolated; and the profile steps pass `--top-ups 0` (a (B, c)
whose cells are too few for their spread is not run again: that took the demo's profiling from 67 to
98 s).
The shipped default head is used when this checkout has one, otherwise a random head.
"""
from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

from online.cli import main as draftgym
from online.vllm.env import vllm_python
from pipeline.decode import step_shape
from pipeline.errors import DraftGymError
from pipeline.models.head import DEFAULT_HEAD_DIR
from pipeline.models.target import resolve_dtype_name
from simulator.methods.ltd.train import LTDConfig
from simulator.serving.formats.export import expressible
from simulator.serving.schedule import is_off_everywhere, Schedule


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--out", default="data/demo")
    ap.add_argument("--model", default="smollm2-135m", help="target (the embedded default, or a HF directory / hub id)")
    ap.add_argument("--head", default=None, help="default: the shipped head if present, else random")
    ap.add_argument("--verify-sizes", default="1,2,4,8,16,32,60,100,240",
                    help="profile: V values (cost is linear in V from 60 up, so 160 is interpolated, within 3-8 %%)")
    ap.add_argument("--contexts", default="32,512",
                    help="profile: context lengths (below 512 tokens the CPU's verify cost moves less with c than "
                         "between two rounds of the same cell, so a middle context bought no information)")
    ap.add_argument("--datasets", default="mt-bench,humaneval")
    ap.add_argument("--train-prompts", type=int, default=10, help="per dataset, train split (the policy's training logs)")
    ap.add_argument("--test-prompts", type=int, default=3, help="per dataset, test split (held out: evaluate and validate)")
    ap.add_argument("--max-new-tokens", type=int, default=64, help="tokens per prompt (collect and validate)")
    ap.add_argument("--ltd-steps", type=int, default=60000,
                    help="PPO env steps per LTD depth phase (size phases a quarter; the training time is about "
                         "linear in it; `draftgym train` trains the method's full budget by default)")
    ap.add_argument("--runs", type=int, default=1, help="validate: timed repeats per prompt")
    ap.add_argument("--batch-sizes", default="1,4,16",
                    help="serving steps: batch sizes to profile and tune a schedule at ('none': skip them)")
    ap.add_argument("--serving-verify-sizes", default="1,2,4,8", help="serving steps: V values profiled at each B")
    ap.add_argument("--serving-context", type=int, default=128, help="serving steps: the context length profiled")
    ap.add_argument("--profile-interleave", type=int, default=1, help="validate: profile rounds between the generations")
    ap.add_argument("--no-ray", action="store_true", help="collect in-process instead of as a Ray job")
    ap.add_argument("--no-vllm", action="store_true", help="skip the last step, the export run in vLLM (skipped anyway "
                                                            "when vLLM is not installed: make vllm)")
    ap.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                    help="compute dtype of every step (default: bf16 on a GPU, pipeline.models.target.default_cpu_dtype on a CPU)")
    args = ap.parse_args(argv)
    dt = ["--dtype", resolve_dtype_name(args.dtype)]     # resolved once: every step uses the same dtype
    head = args.head or ("default" if (DEFAULT_HEAD_DIR / "config.json").is_file() else "random")
    out = Path(args.out)
    logs, policy, report, serving = out / "logs", out / "policies" / "ltd", out / "report", out / "serving"
    schedule = serving / "schedule.json"
    t0 = time.perf_counter()
    steps = []
    for ds in args.datasets.split(","):
        for split, n in (("train", args.train_prompts), ("test", args.test_prompts)):
            steps.append(["collect", "--model", args.model, "--head", head, "--dataset", ds, "--split", split, "--n-prompts", str(n),
                          "--max-new-tokens", str(args.max_new_tokens), "--widths", "1,10", "--out", str(logs)] + dt
                         + (["--no-ray"] if args.no_ray else []))
    steps += [
        ["profile", "--model", args.model, "--head", head, "--verify-sizes", args.verify_sizes, "--contexts", args.contexts,
         "--repeats", "8", "--top-ups", "0", "--out", str(logs)] + dt,
        ["train", "--method", "ltd", "--logs", str(logs), "--out", str(policy), "--steps", str(args.ltd_steps),
         "--iters", "0,1", "--action-space", "wide"],   # wide: small trees too (a superset of LTD's 20..240)
        ["profile-policy", "--model", args.model, "--head", head, "--policy", str(policy), "--logs", str(logs)] + dt,
        ["evaluate", "--logs", str(logs), "--split", "test", "--policy", str(policy), "--policy", "goodput"],
        ["validate", "--model", args.model, "--head", head, "--policy", str(policy), "--dataset", args.datasets, "--n-prompts",
         str(args.test_prompts), "--runs", str(args.runs), "--max-new-tokens", str(args.max_new_tokens),
         "--logs", str(logs), "--out", str(report), "--profile-first", "--profile-verify-sizes", args.verify_sizes,
         "--profile-contexts", args.contexts, "--profile-repeats", "8",
         "--profile-interleave", str(args.profile_interleave)] + dt,
    ]
    if args.batch_sizes != "none":
        steps += [
            ["profile", "--model", args.model, "--head", head, "--batch-sizes", args.batch_sizes, "--widths", "1,10", "--verify-sizes",
             args.serving_verify_sizes, "--contexts", str(args.serving_context), "--prefill-lengths", "none",
             "--repeats", "2", "--top-ups", "0", "--out", str(serving)] + dt,
            ["tune", "--logs", str(logs), "--latency", str(serving), "--split", "train", "--batch-sizes", args.batch_sizes,
             "--out", str(schedule), "--plot", str(serving / "schedule.png")],
            ["export", "--schedule", str(schedule), "--format", "vllm", "--best-expressible",
             "--out", str(serving / "vllm_speculative_config.json")],
        ]
        if not args.no_vllm:
            steps.append(["vllm-run", "--model", args.model, "--head", head, "--dataset", args.datasets.split(",")[0],
                          "--n-prompts", str(args.test_prompts), "--max-new-tokens", str(args.max_new_tokens), "--k", "0,1,2",
                          "--schedule", str(serving / "vllm_speculative_config.json"), "--batch-sizes", "1,4",
                          "--compare-logs", str(logs), "--out", str(out / "vllm")] + dt)
    print(f"DraftGym demo: {args.model} in {dt[1]}, head {head}, output under {out}/", flush=True)
    for i, cmd in enumerate(steps, 1):
        if cmd[0] in ("export", "vllm-run") and not vllm_speculates(schedule):
            print(f"\n[{i}/{len(steps)}] {cmd[0]}: skipped, vLLM would never speculate (AR beats every chain it can run "
                  f"at every tuned B here); serve without a speculative config", flush=True)
            continue
        if cmd[0] == "vllm-run" and not vllm_installed():
            print(f"\n[{i}/{len(steps)}] vllm-run: skipped, vLLM is not installed (`make vllm`, docs/vllm.md)", flush=True)
            continue
        print(f"\n[{i}/{len(steps)}] draftgym {shlex.join(cmd)}", flush=True)
        ts = time.perf_counter()
        rc = draftgym(cmd)
        print(f"[{i}/{len(steps)}] {cmd[0]}: {time.perf_counter() - ts:.0f} s", flush=True)
        if rc != 0:
            print(f"demo: step {i} failed (exit {rc})", file=sys.stderr)
            return rc
    note = training_note(args.ltd_steps)
    with open(report / "report.md", "a") as f:
        f.write(f"\n## This demo's policy\n\n{note}\n")
    print(f"\nnote: {note}")
    print(f"\ndemo finished in {time.perf_counter() - t0:.0f} s; report: {report / 'report.md'}"
          + ("" if args.batch_sizes == "none" else f"; schedule: {schedule} ({serving / 'schedule.png'})"))
    return 0


def training_note(ltd_steps: int) -> str:
    """What the report says of the demo's LTD policy: its budget against `draftgym train`'s own, and where the
    full-budget figures are (a short budget trails grid-best where the full one beats it)."""
    full = LTDConfig().depth_steps
    return (f"LTD trained {ltd_steps:,} PPO steps per depth phase (size phases a quarter) to fit the demo's time "
            f"budget; `draftgym train --method ltd` trains {full:,} by default. A policy trained this briefly can "
            f"trail grid-best; the full-budget figures are in BENCHMARKS.md (headline table).")


def vllm_installed() -> bool:
    try:
        return bool(vllm_python())
    except DraftGymError:
        return False


def vllm_speculates(schedule_path) -> bool:
    """Whether the schedule, as vLLM can run it (export --best-expressible: each tuned B's best chain), drafts
    at some batch size; if not (AR everywhere, or every shape that beat AR a tree), there is nothing to export."""
    return not is_off_everywhere(expressible(Schedule.load(schedule_path), step_shape.is_chain, "vLLM", best=True)[0])


if __name__ == "__main__":
    sys.exit(main())
