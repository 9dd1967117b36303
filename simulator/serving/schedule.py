"""A schedule: which shape to run at which batch size.

    ranges = [(lo_1 = 1, hi_1, s_1), (lo_2 = hi_1 + 1, hi_2, s_2), ...]     inclusive, contiguous from 1

A batch of B rows runs the shape of the range holding B; beyond the last range, the last shape.
This is the form of vLLM's `num_speculative_tokens_per_batch_size` ([[start_bs, end_bs, K], ...],
docs/features/speculative_decoding/dynamic_speculative_decoding.md in the vLLM repository) and of
SGLang's adaptive tiers (one tier per lower bound); simulator/serving/formats/export.py writes both.

From tuned batch sizes (`from_choices`): the shape found best at B_i holds from B_i to
B_{i+1} - 1 (the first from 1, the last up to `max_batch`), and neighbouring ranges with the same
shape merge. A schedule written by `draftgym tune` also keeps its tuning table (tokens/s of every
candidate shape at every tuned B), so an export can replace a shape an engine cannot run by the best
one it can (`best_at`).

JSON (`to_json` / `load`):
    {"format": "draftgym.schedule", "version": 1,
     "ranges": [{"batch": [1, 7], "shape": "tree:4,10,20"}, {"batch": [8, 32], "shape": "chain:2"}, ...],
     "tuning": {"batch_sizes": [...], "shapes": [...], "tokens_per_s": [[...], ...]} (optional),
     "meta": {...}}
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pipeline.decode.step_shape import (OFF, StepShape, batch_ranges, canonical, chain, label, parse,
                                        shape_for_batch)
from pipeline.errors import DataError, DraftGymError

FORMAT = "draftgym.schedule"

# vLLM's documented EAGLE-3 example (dynamic_speculative_decoding.md, "Dynamic SD Eagle3 Drafter"): chain K by batch size
VLLM_EAGLE3_EXAMPLE = ((1, 16, 5), (17, 32, 4), (33, 64, 3), (65, 128, 1), (129, 512, 0))


@dataclass
class Schedule:
    ranges: list[tuple[int, int, StepShape]]
    tuning: dict | None = None          # {"batch_sizes": [n], "shapes": [A labels], "tokens_per_s": [n][A]}
    meta: dict = field(default_factory=dict)

    def __post_init__(self):
        """The engine's rule (step_shape.batch_ranges), every range closed: the file says up to which B it was tuned."""
        try:
            rs = batch_ranges(self.ranges)
        except DraftGymError as e:
            raise DataError(str(e)) from None
        if rs[-1][1] is None:
            raise DataError("schedule: the last range is open; a schedule's ranges end at the largest batch tuned")
        self.ranges = [(lo, hi, canonical(s)) for lo, hi, s in rs]

    # ---- reading
    def shape_for(self, batch: int) -> StepShape:
        return shape_for_batch(self.ranges, batch)

    @property
    def max_batch(self) -> int:
        return self.ranges[-1][1]

    def shapes(self) -> list[StepShape]:
        return list(dict.fromkeys(s for _, _, s in self.ranges))

    def table(self) -> list[tuple[str, str]]:
        """[(batch range, shape label)] for printing."""
        return [(f"{lo}-{hi}" if hi > lo else f"{lo}", label(s)) for lo, hi, s in self.ranges]

    def best_at(self, batch: int, allowed) -> StepShape:
        """The tuning table's best shape at the tuned batch size that covers `batch` among those for
        which allowed(shape) is true (what an engine that cannot run the schedule's own shape runs)."""
        if not self.tuning:
            raise DataError("this schedule has no tuning table (write it with `draftgym tune`) to pick a "
                            "best expressible shape from")
        bs = list(self.tuning["batch_sizes"])
        i = max([k for k, b in enumerate(bs) if b <= batch], default=0)
        shapes = [parse(s) for s in self.tuning["shapes"]]
        tps = np.asarray(self.tuning["tokens_per_s"], np.float64)[i]
        ok = [a for a, s in enumerate(shapes) if allowed(s)]
        if not ok:
            raise DataError("no expressible shape in the tuning table")
        return shapes[max(ok, key=lambda a: tps[a])]

    # ---- building
    @classmethod
    def from_choices(cls, batch_sizes, shapes, max_batch: int | None = None, **kw) -> "Schedule":
        """Tuned (B_i, best shape at B_i) -> merged ranges (module docstring)."""
        order = np.argsort(batch_sizes)
        bs = [int(batch_sizes[i]) for i in order]
        ss = [canonical(shapes[i]) for i in order]
        if len(set(bs)) != len(bs) or bs[0] < 1:
            raise DataError(f"batch sizes must be distinct and >= 1, got {list(batch_sizes)}")
        top = max(bs[-1], int(max_batch or bs[-1]))
        ranges = []
        for i, (b, s) in enumerate(zip(bs, ss)):
            lo = 1 if i == 0 else b
            hi = bs[i + 1] - 1 if i + 1 < len(bs) else top
            if ranges and ranges[-1][2] == s:
                ranges[-1] = (ranges[-1][0], hi, s)
            else:
                ranges.append((lo, hi, s))
        return cls(ranges, **kw)

    @classmethod
    def from_vllm(cls, ranges, **kw) -> "Schedule":
        """vLLM's num_speculative_tokens_per_batch_size, [[start_bs, end_bs, K], ...], as chains (K = 0: off)."""
        return cls([(lo, hi, chain(k)) for lo, hi, k in ranges], **kw)

    @classmethod
    def vllm_eagle3_example(cls) -> "Schedule":
        return cls.from_vllm(VLLM_EAGLE3_EXAMPLE, meta={"source": "vLLM docs example"})

    @classmethod
    def static(cls, shape, max_batch: int = 1) -> "Schedule":
        return cls([(1, max_batch, shape)])

    # ---- JSON
    def to_json(self) -> dict:
        out = {"format": FORMAT, "version": 1,
               "ranges": [{"batch": [lo, hi], "shape": label(s)} for lo, hi, s in self.ranges]}
        if self.tuning:
            out["tuning"] = self.tuning
        if self.meta:
            out["meta"] = self.meta
        return out

    @classmethod
    def from_json(cls, obj: dict, where: str = "schedule") -> "Schedule":
        if not isinstance(obj, dict) or obj.get("format") != FORMAT:
            raise DataError(f"{where}: not a DraftGym schedule (expected \"format\": \"{FORMAT}\")")
        try:
            ranges = [(int(r["batch"][0]), int(r["batch"][1]), parse(r["shape"])) for r in obj["ranges"]]
        except (KeyError, TypeError, IndexError, ValueError) as e:
            raise DataError(f"{where}: bad ranges ({e!r}); each is {{\"batch\": [lo, hi], \"shape\": ...}}") from None
        return cls(ranges, tuning=obj.get("tuning"), meta=obj.get("meta") or {})

    def dumps(self) -> str:
        """The JSON text, one range and one tuning row per line."""
        obj = self.to_json()
        parts = [f' "format": "{FORMAT}"', ' "version": 1',
                 ' "ranges": [\n' + ",\n".join("  " + json.dumps(r) for r in obj["ranges"]) + "\n ]"]
        if self.tuning:
            t = self.tuning
            rows = ",\n".join("   " + json.dumps(r) for r in t["tokens_per_s"])
            parts.append(f' "tuning": {{"batch_sizes": {json.dumps(t["batch_sizes"])}, "shapes": {json.dumps(t["shapes"])},'
                         f'\n  "tokens_per_s": [\n{rows}\n  ]}}')
        if self.meta:
            parts.append(f' "meta": {json.dumps(self.meta)}')
        return "{\n" + ",\n".join(parts) + "\n}\n"

    def save(self, path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.dumps())
        return path

    @classmethod
    def load(cls, path) -> "Schedule":
        path = Path(path)
        if not path.is_file():
            raise DataError(f"schedule file {path} not found")
        try:
            obj = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise DataError(f"{path}: not JSON ({e})") from None
        return cls.from_json(obj, str(path))


def is_off_everywhere(schedule: Schedule) -> bool:
    return all(s == OFF for _, _, s in schedule.ranges)
