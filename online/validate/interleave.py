"""`draftgym validate --batch-sizes ... --profile-interleave ROUNDS`: a time-local latency profile at
each B, sampled between the generations it predicts.

Why: on a shared VM the same batched step can cost 20-35 % more or less from one hour to the next,
so a replay timed by a profile taken earlier is off by that much for every method alike (+15 to
+30 % or -18 to -25 % at B = 4), while the ratios that choose a shape hold.
Batch 1 has the same remedy (`--profile-interleave` in online/validate/batch1.py, rounds of the profile's
sampler, pipeline/profiling/profile.py ProfileSampler, spread over the decoding); this is its
counterpart for the per-B methods: the same step samples (pipeline/profiling/steps.py), sliced per
generation and per B.

What runs: at every run r and batch size B, before each method's generation at B, one *slice*: for
each context level c, B prompts of c tokens (pipeline/profiling/profile.py context_prompt, not the
validated prompts) prefilled into the batched engine, then one generation
playing the shapes the methods run at B round-robin (pipeline/profiling/steps.py grid_shapes,
one warm-up round + ROUNDS timed rounds; each step one sample of draft_step (W, c, B), verify
(V, c, B) and overhead (c, B)). The context levels span the validated steps: the shortest prompt
and the longest prompt + max_new_tokens. Why a slice per generation and not one long one: on a shared VM
the same step's mean moves by 10-15 % from one generation to the next, so a cell's error
shrinks with the number of generations sampled, not with the steps within one; the slices are as
many as the generations they predict, and spread over the same minutes.

The time-local profile: the logs' latency profile (what the replay uses without this flag) with
every (op, B) level the slices measured replaced by the slices' samples pooled over the runs (at
B = 1 too: validate runs the batched engine there), everything else (prefill, policy rows, other B)
copied. It is written as a new profile under OUT/latency, and the replay is timed with it; the
error against the logs' profile stays in the report as a second column.
"""
from __future__ import annotations

import time

from pipeline.decode.engine.core import BatchEngine
from pipeline.decode.step_shape import StepShape
from pipeline.errors import DataError
from pipeline.profiling.profile import context_prompt, new_profile_id, profile_rows, row_maker, write_profile
from pipeline.profiling.steps import grid_shapes, rows_of, step_samples
from simulator.latency.batch import row_batch
from simulator.latency.model import LatencyModel

def slice_grid(shapes) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(widths, verify sizes) of the profile grid that holds the canonical shapes (D, W, V) run at one B:
    width 1 and V = 1 (the AR step) always; each shape's V clamped to its pool (the engine's V_eff)."""
    widths, sizes = {1}, {1}
    for s in map(StepShape.of, shapes):
        if not s.is_off:
            widths.add(s.width)
            sizes.add(s.effective.verify_size)
    return tuple(sorted(widths)), tuple(sorted(sizes))


class BatchProfileSlices:
    """The slices of one validation (module docstring). `__call__(B)` runs one slice at B; `rows()`
    pools every slice's samples into latency rows (op, stats, W, V, c, B)."""

    def __init__(self, engine, tokenizer, shapes_at: dict[int, list[tuple]], contexts, rounds: int):
        if rounds < 1:
            raise ValueError(f"rounds must be >= 1, got {rounds}")
        self.eng = BatchEngine(engine.model, engine.head, eos_token_ids=set())       # no EOS: the rows stay B
        self.prompt = lambda c, r: context_prompt(tokenizer, c, r)
        self.grids = {B: grid_shapes(*slice_grid(s)) for B, s in shapes_at.items()}
        self.contexts, self.rounds = tuple(sorted(set(contexts))), rounds
        self.samples: dict[tuple, list[float]] = {}
        self.slices = 0
        self.seconds = 0.0

    def __call__(self, batch: int) -> None:
        t0 = time.perf_counter()
        for c in self.contexts:
            got = step_samples(self.eng, batch, self.grids[batch], c, self.prompt, self.rounds)
            for key, ts in got.items():
                self.samples.setdefault(key, []).extend(ts)
        self.slices += 1
        self.seconds += time.perf_counter() - t0

    def rows(self) -> list[tuple]:
        return rows_of(self.samples)


def slice_contexts(prompts: list[list[int]], max_new_tokens: int, max_positions: int) -> tuple[int, int]:
    """The two context levels of a slice: the shortest prompt, and the longest prompt + max_new_tokens
    (capped so a slice's rows fit the target's positions with room for its own steps)."""
    lo = min(len(p) for p in prompts)
    hi = min(max(len(p) for p in prompts) + max_new_tokens, max_positions - 256)
    return lo, max(lo, hi)


def time_local_profile(slices: BatchProfileSlices, engine, logs_root: str, base_profile: str, model: str, out: str,
                       dev: str, dtype: str):
    """The time-local profile (module docstring) written under `<out>/latency`; returns (LatencyModel, info)."""
    measured_rows = slices.rows()
    measured = {(op, B) for op, _, _, _, _, B in measured_rows}
    base = profile_rows(logs_root, base_profile)
    if not base:
        raise DataError(f"latency profile {base_profile!r} not found under {logs_root}/latency")
    pid = new_profile_id()
    kept = [{**r, "profile_id": pid} for r in base if (r["op"], row_batch(r)) not in measured]
    row = row_maker(engine, base[0]["model_id"], pid)
    rows = kept + [row(op, stats, W, V, c, B) for op, stats, W, V, c, B in measured_rows]
    path = write_profile(rows, out, base[0]["model_id"], pid)
    lat = LatencyModel.from_logs(out, model=model, device=dev, dtype=dtype, profile=pid)
    info = {"profile_id": pid, "from_profile": base_profile, "path": str(path), "slices": slices.slices,
            "rounds": slices.rounds, "contexts": list(slices.contexts), "seconds": slices.seconds,
            "levels": sorted(f"{op}@B{B}" for op, B in measured), "copied_rows": len(kept)}
    return lat, info
