"""What the serving commands replay: the logs and latency profile `tune`, `serve-eval` and
`train-load` read (ServingLogsConfig, load_inputs), and which step shapes those logs can replay and
that profile can price (the shape itself: pipeline/decode/step_shape.py).

Acceptance of a shape at a logged position is read from the width-W acceptance table at the
column of V (docs/design.md, "Exact counterfactual replay"). V must be on the logged grid, with one
exact exception: a shape that verifies its whole pool (every chain) accepts the same L at every
V >= 1 + pool, so its column is the smallest grid V >= 1 + pool (chain 2 = (2, 1, 3) reads V = 4).
`candidates` is the set a `tune` tries; `profiled_candidates` leaves out what the profile cannot price.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np

from pipeline.decode.step_shape import CHAIN_KS, OFF, StepShape, canonical, chain, label, pool_size
from pipeline.errors import DataError, DraftGymError
from simulator.latency.model import LatencyModel
from simulator.logs.stream import DEFAULT_MAX_POSITIONS, LogSource


@dataclass
class ServingLogsConfig:
    """Which logs and latency profile tune, serve-eval and train-load replay (`load_inputs` reads these;
    simulator/serving_cli.py's `_serving_logs_args` gives their options)."""
    logs: str = ""                        # logs root (sequences/, positions/, latency/) (required)
    model: str | None = None              # model partition (default: the only one)
    temperature: float | None = None      # temperature partition (default: the only one)
    dataset: str | None = None            # comma-separated datasets (default: all)
    dtype: str | None = None              # the logs' dtype (default: the only one)
    profile: str | None = None            # latency profile_id (default: the newest of the logs' dtype)
    latency: str | None = None            # root holding latency/ (default: --logs)
    latency_model: str | None = None      # time the logs with this model's profile (a what-if; load_inputs)
    max_positions_in_memory: int = DEFAULT_MAX_POSITIONS   # larger logs: a seeded window of this many positions


def log_source(cfg, split: str | None = None, progress: bool = False) -> LogSource:
    """The logs a tune / serve-eval / train-load config selects (its split unless `split`), every width."""
    return LogSource(cfg.logs, model=cfg.model, temperature=cfg.temperature, datasets=cfg.dataset,
                     split=split or cfg.split, widths="all", dtype=cfg.dtype, progress=progress)


def load_inputs(cfg, split: str | None = None, seed: int = 0, window_note: bool = True):
    """(logs of the split, every width, the latency model of the logs' dtype) for a tune / serve-eval /
    train-load config: the whole split, or a window of cfg.max_positions_in_memory positions drawn with
    `seed` when it is larger (simulator.logs.stream.LogSource.sample; its note printed unless not
    window_note: tune --ray reads every position and uses the window only for the candidates)."""
    src = log_source(cfg, split)
    logs = src.sample(cfg.max_positions_in_memory, seed=seed)
    for note in logs.notes[len(src.notes):] if window_note else ():   # the window's (stderr: --json stays one object)
        print("note: " + note, file=sys.stderr)
    what_if = getattr(cfg, "latency_model", None)
    # a what-if times the logs with another model's profile, in that profile's own dtype
    lat = LatencyModel.from_logs(cfg.latency or cfg.logs, model=what_if or logs.model, profile=cfg.profile,
                                 dtype=None if what_if else logs.dtype, trust=True)
    if what_if:
        lat.meta["what_if"] = (f"what-if: the acceptance of {logs.model} ({logs.dtype} logs) with the step costs of "
                               f"{lat.meta.get('model_id')}'s profile {lat.meta.get('profile_id')} "
                               f"({lat.meta.get('device')}): the mechanics, not that model's figures")
    for key in ("trust_note", "what_if"):      # stderr: a --json stdout stays one object
        if lat.meta.get(key):
            print("note: " + lat.meta[key], file=sys.stderr)
    return logs, lat


# ------------------------------------------------------------------ the shapes they can replay

def lookup_verify(logs, shape) -> int:
    """The grid V whose acceptance column gives this shape's L (module docstring); DataError when the
    logs cannot replay the shape exactly."""
    d, w, v = canonical(shape)
    if d == 0:
        return 1
    if d > logs.max_depth:
        raise DataError(f"{label(shape)}: depth {d} beyond the logged max_depth {logs.max_depth}")
    if w not in logs.w:
        hint = " (chains need width-1 logs: collect with --widths 1,10)" if w == 1 else ""
        raise DataError(f"{label(shape)}: width {w} not in the loaded logs (widths {list(logs.w)}){hint}")
    grid = np.asarray(logs.verify_grid)
    if v in grid:
        return v
    if v == 1 + pool_size(d, w) and (grid >= v).any():
        return int(grid[grid >= v].min())
    raise DataError(f"{label(shape)}: V = {v} is not on the logged grid {grid.tolist()}")


def replayable(logs, shape) -> bool:
    try:
        lookup_verify(logs, shape)
        return True
    except DataError:
        return False


def candidates(logs, which: str = "all") -> list[StepShape]:
    """The shapes a tune tries: off always; chains K = 1..8 (needs width-1 logs); trees: every
    depth, logged width >= 2 and grid V >= 2, as the batch-1 grid search (simulator.baselines.static_space),
    deduplicated in effective form."""
    if which not in ("chain", "tree", "all"):
        raise DraftGymError(f"--shapes must be chain, tree or all, got {which!r}")
    out = [OFF]
    if which in ("chain", "all"):
        out += [chain(k) for k in CHAIN_KS if replayable(logs, chain(k))]
    if which in ("tree", "all"):
        grid = [int(v) for v in logs.verify_grid if v >= 2]
        out += [canonical((d, w, v)) for w in sorted(logs.w) if w >= 2
                for d in range(1, logs.max_depth + 1) for v in grid]
    seen, uniq = set(), []
    for s in out:
        if s not in seen and replayable(logs, s):
            seen.add(s)
            uniq.append(s)
    if which == "chain" and len(uniq) == 1:
        raise DataError(f"no chain shape replayable: the logs have widths {list(logs.w)} (chains need width 1)")
    return uniq


def profiled_candidates(logs, latency, which: str = "all") -> tuple[list, str | None]:
    """candidates, less the shapes whose V or W lies beyond the profile's measured range: the
    latency model holds time flat there (simulator/latency/surface.py), so a V = 240 tree would cost
    what the largest profiled V costs and win on paper. Returns (shapes, a note naming what was left
    out, or None)."""
    cands = candidates(logs, which)
    v_max = float(np.max(latency.verify.points["x"]))
    w_max = float(np.max(latency.draft.points["x"]))
    keep = [s for s in cands if s[2] <= v_max and s[1] <= w_max]
    dropped = len(cands) - len(keep)
    note = (f"left out {dropped} shapes with V > {v_max:g} or W > {w_max:g}, beyond the latency profile's "
            f"measured range (profile larger --verify-sizes / --widths to tune them)") if dropped else None
    return keep, note
