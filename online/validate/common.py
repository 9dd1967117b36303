"""What every `draftgym validate` report shares: its settings, the checks it makes before any model
loads, the prompt sets, the acceptance logs the replay reads, and how a report is printed.

validate runs in one of three modes, each with its config (the shared `ValidateConfig` and its own
settings) and its module:

    Batch1Config       batch 1 (the default): policies, AR, static and grid-best     batch1.py
    BatchSizesConfig   --batch-sizes: AR, static shapes and a schedule at each B     batch.py
    LoadTraceConfig    --load-trace: the engine serving arrivals beside the replay   load.py
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path

from pipeline.datasets import load_prompts, resolve_split
from pipeline.decode.step_shape import EAGLE3_DEFAULT_SHAPE
from pipeline.errors import DataError, DraftGymError
from simulator.latency.model import LatencyModel
from simulator.logs.stream import DEFAULT_MAX_POSITIONS, LogSource
from simulator.policy_specs import parse_spec


@dataclass
class ValidateConfig:
    """What every `draftgym validate` mode shares: the target and head, the prompts decoded, the
    methods' common settings, the acceptance logs the replay reads and where the report goes."""

    model: str = "smollm2-135m"          # target: 'smollm2-135m' (embedded), a HF model directory or a hub id
    head: str = "default"                # EAGLE-3 head: 'default', 'random', a directory or a hub id
    policies: list[str] = field(default_factory=list)   # checkpoint dirs or built-in specs (simulator.policy_specs)
    datasets: tuple = ("mt-bench",)      # built-in prompt sets or prompt files
    split: str | None = None             # train | val | test | all; None: test for built-ins, all of a user's file
    n_prompts: int = 5                   # first N prompts per dataset
    temperature: float = 0.0             # 0 = greedy (outputs checked against AR); > 0 samples
    runs: int = 3                        # Spec-Bench-style repeats (mean and std over runs)
    max_new_tokens: int = 128            # tokens generated per prompt
    seed: int = 0                        # sampling seed base (seed + 1000 * run + prompt index)
    logs: str | None = "data/logs"       # for grid-best and sim-vs-real (None: skip both)
    out: str = "data/reports/validate"   # report folder (report.md, report.json, PNGs, cycles Parquet)
    device: str | None = None            # None: cuda if present, else cpu
    dtype: str | None = None             # compute dtype (default: bf16 on a GPU, pipeline.models.target.default_cpu_dtype on a CPU)
    logs_dtype: str | None = None        # the acceptance logs' dtype, when not the decoding's (transfer: logs of one
                                         # setting, the profile and decoding of another); None: the decoding's
    profile_first: bool = False          # profile this device in situ right before decoding (batch 1; see profile_first)
    profile_verify_sizes: tuple = (1, 2, 4, 8, 16, 32, 60, 100, 240)
    profile_contexts: tuple = (32, 128, 512)
    profile_repeats: int = 8             # timed rounds per context's generation (pipeline/profiling/steps.py)
    profile_interleave: int = 0          # further profile rounds spread between the generations (implies profile_first
                                         # at batch 1; at --batch-sizes online/validate/interleave.py)
    max_positions_in_memory: int = DEFAULT_MAX_POSITIONS   # --logs larger than this are read as a window plus
                                         # the decoded prompts' sequences; grid-best streams them
    as_json: bool = False                # run_validate_command: print the report as one JSON object
    progress: bool = True                # run_validate_command: progress bars


@dataclass
class Batch1Config(ValidateConfig):
    """Batch 1 (online/validate/batch1.py): the policies, AR, the static EAGLE-3 default and the
    grid-best static config, the lossless check and sim-vs-real."""

    reanchor: bool = True                # T = 0 sim-vs-real: also replay each method on its own decoded text
                                         # (online/validate/reanchor.py: collected after the decoding, cheap next to it)


@dataclass
class ServedShapes(ValidateConfig):
    """The static shapes and schedule the two batched modes serve besides AR."""

    shapes: tuple = ("tree:8,10,60", "chain:2", "chain:4")   # spelled off | chain:K | tree:D,W,V
                                         # (pipeline/decode/step_shape.py)
    schedule: str | None = None          # a schedule JSON written by `draftgym tune`, run as one method


@dataclass
class BatchSizesConfig(ServedShapes):
    """--batch-sizes (online/validate/batch.py): every method at each B with the batched engine."""

    batch_sizes: tuple = (1, 4, 16)      # the batch sizes B, each a closed batch of max(N, 2B) requests


@dataclass
class LoadTraceConfig(ServedShapes):
    """--load-trace (online/validate/load.py): the engine serving a file of arrival times, and the
    continuous-batching replay of the same trace."""

    load_trace: str = ""                 # a file of arrival times (s)
    max_batch: int = 16                  # the most rows decoding at once
    row_budget_k: int = 0                # > 0 adds vLLM's adaptive verification over chains of K
    nightjar_k: int = 0                  # > 0 adds Nightjar's bandit over chains 0..K
    acceptance_model: str | None = None  # an acceptance model JSON (serve-eval --acceptance-model-out) adds
                                         # DraftGym's learned per-request budget


MODE_NAMES = {Batch1Config: "batch 1 (no --batch-sizes or --load-trace)", BatchSizesConfig: "--batch-sizes",
              LoadTraceConfig: "--load-trace"}
MODE_FIELDS = {f.name for m in MODE_NAMES for f in fields(m)} - {f.name for f in fields(ValidateConfig)}   # one mode's or two


def validate_mode(options: dict[str, str]):
    """The mode's config class for the settings a user gave ({field: its option's flag}), or a one-line
    error for a setting of another mode (a flag the chosen mode would silently ignore)."""
    if "load_trace" in options and "batch_sizes" in options:
        raise DraftGymError("--load-trace and --batch-sizes are two runs: the trace's load sets the batch size")
    mode = LoadTraceConfig if "load_trace" in options else BatchSizesConfig if "batch_sizes" in options else Batch1Config
    if "schedule" in options and mode is Batch1Config:
        raise DraftGymError("--schedule needs --batch-sizes or --load-trace (a schedule picks a shape per batch size)")
    own = {f.name for f in fields(mode)}
    for name, flag in options.items():
        if name not in own:
            owners = " and of ".join(label for m, label in MODE_NAMES.items() if name in {f.name for f in fields(m)})
            raise DraftGymError(f"{flag} is a setting of {owners}, not of {MODE_NAMES[mode]}")
    return mode


def load_prompt_sets(cfg: ValidateConfig) -> dict:
    """{dataset: the first n_prompts records of its split}; an empty set is a one-line error."""
    prompt_sets = {}
    for ds in cfg.datasets:
        split = resolve_split(ds, cfg.split)
        prompt_sets[ds] = load_prompts(ds, split=split, n=cfg.n_prompts)
        if not prompt_sets[ds]:
            raise DraftGymError(f"no prompts in {ds}" + (f" split {split}" if split else ""))
    return prompt_sets


def load_acceptance_logs(cfg: ValidateConfig, logs_dtype: str, prompt_ids=()):
    """(the acceptance logs for grid-best and sim-vs-real, or None without --logs; a note when there is
    no sim-vs-real; the LogSource when the logs are larger than --max-positions-in-memory, else None).
    Logs that fit are read whole (= load_logs); larger ones as a replay window (seed cfg.seed) plus the
    sequences of `prompt_ids` (the prompts decoded, which sim-vs-real replays), and grid-best streams over
    the source (simulator_side)."""
    if not cfg.logs:
        if cfg.profile_first or cfg.profile_interleave:
            raise DraftGymError("--profile-first needs --logs (the acceptance logs the simulator replays)")
        return None, None, None

    def read(temperature: float):
        src = LogSource(cfg.logs, model=cfg.model, temperature=temperature, widths="all", dtype=logs_dtype,
                        progress=cfg.progress)
        budget = cfg.max_positions_in_memory
        logs = _with_default_width(src.sample(budget, seed=cfg.seed, include=prompt_ids), cfg.logs)
        return logs, (src if src.n_positions > budget else None)

    try:
        logs, src = read(cfg.temperature)
        return logs, None, src
    except DataError as e:
        if cfg.temperature <= 0 or "temperature" not in str(e):
            raise
    # T > 0 without logs at this T: grid-best still comes from the greedy logs (acceptance at
    # T > 0 is what the sampled rule gives, so this choice is an approximation), and there is
    # no sim-vs-real (the replay needs logs at the decoding temperature).
    logs, src = read(0.0)
    return logs, (f"no logs at temperature {cfg.temperature:g} in {cfg.logs}: grid-best tuned on the T = 0 logs; "
                  f"no sim-vs-real (collect with --temperature {cfg.temperature:g} for it)"), src


def load_replay(cfg: ValidateConfig, dev: str, dtype: str, prompt_ids: list[str]):
    """(acceptance logs, latency model, note): both None with a note when the logs cannot be replayed
    (logs larger than --max-positions-in-memory: a window plus the sequences of `prompt_ids`)."""
    if not cfg.logs:
        return None, None, "no --logs: no replayed tokens/s"

    try:
        logs, note, _ = load_acceptance_logs(cfg, dtype, prompt_ids)
        if note:
            return None, None, note
        return logs, LatencyModel.from_logs(cfg.logs, model=logs.model, device=dev, dtype=dtype), None
    except DataError as e:
        return None, None, f"no replay: {e}"


def _with_default_width(logs, root):
    """The logs, if they hold the static default's width (its sim-vs-real row replays it); else one line,
    before anything is decoded."""
    W = EAGLE3_DEFAULT_SHAPE[1]
    if W not in logs.widths:
        raise DataError(f"{root}: the logs hold widths {list(logs.widths)}, but validate replays the static default "
                        f"{EAGLE3_DEFAULT_SHAPE} at width {W}: collect with --widths {W}")
    return logs


def check_config(cfg: ValidateConfig) -> None:
    """The settings `draftgym validate` refuses up front, in one line, before any model loads."""
    if cfg.temperature < 0:
        raise DraftGymError(f"temperature must be >= 0, got {cfg.temperature}")
    if cfg.runs < 1 or cfg.n_prompts < 1:
        raise DraftGymError("--runs and --n-prompts must be >= 1")
    if cfg.profile_interleave < 0:
        raise DraftGymError(f"--profile-interleave must be >= 0, got {cfg.profile_interleave}")
    if (cfg.profile_first or cfg.profile_interleave) and not cfg.logs:
        raise DraftGymError("--profile-first needs --logs (the acceptance logs the simulator replays)")
    for spec in cfg.policies:
        parse_spec(spec)                 # an unknown spec or a missing checkpoint directory: one line
    if cfg.logs and not Path(cfg.logs).is_dir():
        raise DraftGymError(f"logs directory not found: {cfg.logs} (pass --logs '' to skip grid-best and sim-vs-real)")


def print_report(cfg: ValidateConfig, rep: dict) -> int:
    """Print the report (JSON with --json, else report.md) and return the exit status: 1 when an
    output at T = 0 was not lossless."""
    if cfg.as_json:
        print(json.dumps(rep, default=str))
    else:
        print((Path(cfg.out) / "report.md").read_text())
        print(f"report: {Path(cfg.out) / 'report.md'}")
    return 0 if all(e["lossless"] for e in rep["datasets"].values()) else 1
