"""What the three trainers share: `draftgym train`'s settings (PolicyTrainConfig), what each method
gives the one training entry (TrainMethod, run by simulator/methods/run.py), loading train/val logs +
latency, validation, greedy wrappers, output."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from pipeline.errors import DataError, DraftGymError
from simulator.latency.model import LatencyModel
from simulator.logs.replay_logs import ReplayLogs
from simulator.logs.stream import DEFAULT_MAX_POSITIONS, LogSource


@dataclass
class PolicyTrainConfig:
    """`draftgym train`: a policy trained in the replay simulator (simulator.methods.run.run_trainer).
    A method's own hyperparameters are its config (LTDConfig, RadarConfig, RespsConfig), built from
    this by its TrainMethod.configure."""

    method: str = ""                     # radar | ltd | resps (required)
    logs: str = ""                       # logs root: sequences/, positions/, latency/ (required)
    out: str = ""                        # policy directory: checkpoint + manifest.json + curve PNG (required)
    model: str | None = None             # model partition; None: the only one
    temperature: float | None = None     # temperature partition; None: the only one
    dataset: str | None = None           # comma-separated datasets; None: all
    dtype: str | None = None             # the logs' compute dtype; None: the only one
    latency_dtype: str | None = None     # train against the profile of this dtype instead of the logs' own (transfer)
    profile: str | None = None           # latency profile_id; None: the newest of the logs' (or latency_dtype's) dtype
    latency: str | None = None           # root holding latency/; None: `logs`
    steps: int | None = None             # budget; None: the method's own (LTD: 200k depth env steps per depth phase,
                                         # size phases a quarter; RADAR: 3000 gradient steps; Re-SpS: 30k decisions)
    seed: int = 0                        # training seed (nets, rollouts)
    split: str = "train"                 # training split (validation uses val when present)
    width: int | None = None             # W; None: 10 when logged
    n_envs: int | None = None            # parallel replay environments; None: the method's own
    iters: tuple | None = None           # LTD: co-adaptation iterations to run, e.g. (0, 1, 2, 3); None: all
    action_space: str = "seeds"          # seeds: the papers' action sets; wide: adds shallow / small trees
    obs: str = "paper"                   # observations: paper (each method's own) or rich (simulator/observations/rich.py)
    objective: str = "ratio"             # cycle reward: ratio ((L+1)/t_cycle) or rate ((L+1) - lambda t_cycle)
    verify_size: int | None = None       # V of RADAR and LTD's Iter0 depth phase; None: 60, or with action_space
                                         # wide the grid-best static V on the training split
    as_json: bool = False                # print the summary as one JSON object
    progress: bool = True                # progress bars
    max_positions_in_memory: int = DEFAULT_MAX_POSITIONS   # larger logs: a seeded window of this many positions

    def __post_init__(self):
        """Out-of-range settings in one line, before any log is read: else `--steps 0` would train the
        method's default budget (0 read as 'unset') and `--steps -5` one update that exits 0."""
        for flag, v in (("--steps", self.steps), ("--n-envs", self.n_envs), ("--width", self.width),
                        ("--verify-size", self.verify_size), ("--max-positions-in-memory", self.max_positions_in_memory)):
            if v is not None and int(v) < 1:
                raise DraftGymError(f"{flag} must be >= 1, got {v}")


@dataclass(frozen=True)
class TrainMethod:
    """What one method gives `run_trainer` (simulator/train/{ltd,radar,resps}.py each define METHOD)."""

    title: str              # the curve's title: 'LTD', 'RADAR', 'Re-SpS'
    all_widths: bool        # load every logged width (Re-SpS picks W), else the one width
    configure: Callable     # (PolicyTrainConfig, TrainData) -> the method's own config
    train: Callable         # (TrainData, method config, progress) -> result dict (with "history")
    results: Callable       # result -> the method's fields of training.json ("val_tokens_per_s" first)
    save: Callable          # (out dir, result, method config, TrainData, training summary) -> None: the checkpoint


WINDOWS = 8      # RADAR and Re-SpS on logs larger than the window: the run is cut in this many equal parts,
                 # part k trained on window k (LTD: one window per phase, its eight phases)


def window_starts(total: int) -> dict[int, int]:
    """{step (or update) of a loop of `total`: the window k = 1, 2, ... that begins there} (at most
    WINDOWS - 1 of them; fewer when total < WINDOWS)."""
    starts = sorted({k * total // WINDOWS for k in range(1, WINDOWS)} - {0})
    return {s: k for k, s in enumerate(starts, 1)}


@dataclass
class TrainData:
    train: ReplayLogs
    val: ReplayLogs          # the val split, or train when there is none (noted)
    latency: LatencyModel
    notes: list
    refill: Callable[[int], ReplayLogs] | None = None   # logs larger than the window: phase k's training window

    def window(self, phase: int) -> ReplayLogs:
        """The training logs of training phase `phase` (LTD's phases; RADAR's and Re-SpS's k-th part of the
        run, `window_starts`): `train` for phase 0 and whenever the
        logs fit in memory, else a new window of the same size drawn with the seed (seed, phase), which
        becomes `train` (the previous one is dropped first: one window in memory), so a long
        co-adaptation sees more of a large log; validation stays on the first window's val split."""
        if self.refill is not None and phase > 0:
            self.train = None
            self.train = self.refill(phase)
        return self.train


def load_training_data(logs_root, model=None, temperature=None, datasets=None, split: str = "train",
                       width: int | None = None, widths=None, profile=None, latency_root=None,
                       dtype: str | None = None, latency_dtype: str | None = None,
                       max_positions_in_memory: int = DEFAULT_MAX_POSITIONS, seed: int = 0,
                       progress: bool = False) -> TrainData:
    """The training and val splits, as a replay window of at most ~max_positions_in_memory positions
    (simulator.logs.stream.LogSource.sample: shards drawn per dataset in a seeded order; the whole
    selection when it fits, then equal to load_logs)."""
    src = LogSource(logs_root, model=model, temperature=temperature, datasets=datasets, split=[split, "val"],
                    width=width, widths=widths, dtype=dtype, progress=progress)
    lat = LatencyModel.from_logs(latency_root or logs_root, model=src.sel.model, profile=profile,
                                 dtype=latency_dtype or src.sel.dtype)
    if split not in set(src.sel.splits.tolist()):
        raise DataError(f"no sequences in training split {split!r} (splits: {sorted(set(src.sel.splits.tolist()))})")
    logs = src.sample(max_positions_in_memory, seed=seed)
    train = logs.select(split)
    if train.n_sequences == 0:
        raise DataError(f"the replay window of {logs.n_positions:,} positions holds no {split!r} sequence: "
                        f"raise --max-positions-in-memory")
    notes = list(logs.notes)                    # the window's own note when it is not everything
    val = logs.select("val")
    if val.n_sequences == 0 or split == "val":
        val = train
        notes.append("no val split: validating on the training split")
    refill = None
    if logs.n_positions < src.n_positions:
        refill = lambda phase: src.sample(max_positions_in_memory, seed=[seed, phase]).select(split)
    return TrainData(train, val, lat, notes, refill)


def greedy(net):
    """numpy obs -> argmax action (for frozen partner policies inside an env)."""
    from simulator.policies.nets import torch_logits

    return lambda o: torch_logits(net, o).argmax(-1)


def replay_tokens_per_s(policy, logs: ReplayLogs, lat: LatencyModel) -> float:
    from simulator.replay import simulate

    return simulate(policy, logs, lat).summary()["tokens_per_s"]


def resolve_verify_size(cfg: PolicyTrainConfig, data: "TrainData", default: int) -> int:
    """V for the fixed-V phases (RADAR; LTD's depth policy in Iter0).

    --verify-size N wins; with --action-space wide and no N, the V of the grid-best static config on
    the training split under this latency model (on a CPU a small tree; the seeds' 60 on a GPU-like
    profile); otherwise the seeds' default (60). Must be on the logged V grid (exact replay)."""
    v = cfg.verify_size
    if v is None and cfg.action_space == "wide":
        from simulator.baselines import grid_search
        v = grid_search(data.train, data.latency)["by_dataset"]["all"]["config"][2]
    v = default if v is None else int(v)
    try:
        data.train.grid_index(v)               # replay is exact only on the logged grid
    except ValueError as e:
        raise DraftGymError(f"--verify-size: {e}") from None
    return v


def reference_speeds(logs: ReplayLogs, lat: LatencyModel) -> dict:
    from simulator import baselines
    from simulator.replay import autoregressive

    return {"ar": autoregressive(logs, lat).summary()["tokens_per_s"],
            "static": replay_tokens_per_s(baselines.StaticPolicy(*baselines.default_static(logs)), logs, lat)}


def logs_info(data: TrainData, root) -> dict:
    return {"root": str(root), "model": data.train.model, "temperature": data.train.temperature,
            "train_sequences": data.train.n_sequences, "val_sequences": data.val.n_sequences,
            "datasets": data.train.datasets, "latency_profile": data.latency.meta.get("profile_id"),
            "notes": data.notes}


def finish(out, summary: dict, as_json: bool) -> int:
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / "training.json").write_text(json.dumps(summary, indent=2, default=_default) + "\n")
    if as_json:
        print(json.dumps(summary, default=_default))
    else:
        print(f"saved {summary['method']} policy to {out}: validation {summary['val_tokens_per_s']:.2f} tokens/s "
              f"(AR {summary['reference']['ar']:.2f}, static {summary['reference']['static']:.2f}) "
              f"in {summary['wall_s']:.0f} s; curve {summary.get('curve')}")
    return 0


def _default(o):
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    if hasattr(o, "tolist"):
        return o.tolist()
    return str(o)


def resolve_rate_ref(cfg: PolicyTrainConfig, data: "TrainData") -> float:
    """lambda for --objective rate (simulator/envs/core.py, OBJECTIVES): grid-best's replay tokens/s on
    the training split under this latency model, i.e. the rate the policy has to beat. 0 for ratio."""
    if cfg.objective != "rate":
        return 0.0
    from simulator.baselines import grid_search
    return float(grid_search(data.train, data.latency)["by_dataset"]["all"]["tokens_per_s"])
