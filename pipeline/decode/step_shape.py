"""The step shape: one speculation setting for every row of a step, written (D, W, V). Its one home:
the engine, the logs, the replay, schedules, exports and reports all import it from here.

    off          (0, 1, 1)        a plain AR step: no draft, a 1-token verify per row
    chain K      (K, 1, K + 1)    K draft forwards of one beam, all K drafts verified (vLLM's K,
                                  SGLang's num_steps with topk = 1)
    tree         (D, W, V)        EAGLE-3's tree: D forwards of W beams, the V - 1 best of the
                                  pool of W + (D - 1) W^2 candidates verified with the root

A shape is compared in its effective form (V clamped to 1 + pool size, as the engine clamps it:
`canonical`), so that (3, 1, 8) and (3, 1, 4) are the same chain. Spelling on the command line and
in JSON: "off", "chain:K", "tree:D,W,V" (or "D,W,V"): `parse` and `label`. Which shapes a set of
logs can replay is the replay's question (simulator/serving/inputs.py).
"""
from __future__ import annotations

from typing import NamedTuple

from pipeline.errors import DraftGymError

EAGLE3_DEFAULT_SHAPE = (8, 10, 60)     # EAGLE-3's from_pretrained (D, W, V): the static default everywhere
DEFAULT_DEPTH, DEFAULT_WIDTH, DEFAULT_VERIFY_SIZE = EAGLE3_DEFAULT_SHAPE


def pool_size(depth, width):
    """W + (D - 1) W^2: the draft candidates a tree of D forwards over W beams makes (0 when off, D = 0).
    Ints give an int; numpy arrays (the replay's) give an array, elementwise."""
    return (depth > 0) * (width + (depth - 1) * width * width)


class _DWV(NamedTuple):
    depth: int
    width: int
    verify_size: int


class StepShape(_DWV):
    """The one shape type: the shape of one step at any batch size, and the (D, W, V) the
    simulator, `tune`, schedules and reports speak. D draft forwards over W beams, V tokens verified
    per row (root included; D is the most forwards when a depth policy stops early). Off: D = 0,
    V = 1. Chain: W = 1, V = D + 1. Otherwise an EAGLE-3 tree. A tuple, so (8, 10, 60) == the
    default tree, it keys dicts and goes to JSON as [D, W, V].

    Spelling (label / parse below): "off", "chain:K", "tree:D,W,V"."""

    __slots__ = ()

    def __new__(cls, depth: int = DEFAULT_DEPTH, width: int = DEFAULT_WIDTH, verify_size: int = DEFAULT_VERIFY_SIZE):
        d, w, v = int(depth), int(width), int(verify_size)
        if d < 0 or w < 1 or v < 1:
            raise ValueError(f"a step shape needs depth >= 0, width >= 1, verify_size >= 1, got ({d}, {w}, {v})")
        if d == 0 and v != 1:
            raise ValueError(f"a step with no draft (depth 0) verifies the root only (verify_size 1), got ({d}, {w}, {v})")
        return super().__new__(cls, d, w, v)

    @classmethod
    def off(cls) -> "StepShape":
        return cls(0, 1, 1)

    @classmethod
    def chain(cls, depth: int) -> "StepShape":
        return cls(depth, 1, depth + 1)

    @classmethod
    def of(cls, shape) -> "StepShape":
        """Any (depth, width, verify_size) object or 3-sequence as a StepShape (a StepShape as it is:
        the engine asks this of every plan)."""
        if isinstance(shape, StepShape):
            return shape
        if hasattr(shape, "verify_size"):
            return cls(shape.depth, shape.width, shape.verify_size)
        return cls(*shape)

    @property
    def is_off(self) -> bool:
        return self.depth == 0

    @property
    def effective(self) -> "StepShape":
        """V clamped to 1 + the pool (what the engine verifies); off whatever W for D = 0."""
        if self.is_off:
            return StepShape.off()
        return StepShape(self.depth, self.width, min(self.verify_size, 1 + pool_size(self.depth, self.width)))

    @property
    def kind(self) -> str:
        e = self.effective
        return "off" if e.is_off else ("chain" if e.width == 1 and e.verify_size == e.depth + 1 else "tree")

    def label(self) -> str:
        """'off', 'chain:3' or 'tree:8,10,60' (of the effective shape): logs, reports, the command line."""
        e, kind = self.effective, self.kind
        if kind == "off":
            return "off"
        return f"chain:{e.depth}" if kind == "chain" else f"tree:{e.depth},{e.width},{e.verify_size}"


OFF = StepShape.off()
CHAIN_KS = tuple(range(1, 9))           # the chains every candidate set tries (vLLM's K = 1..8)


def canonical(shape) -> StepShape:
    """(D, W, V) with V clamped to 1 + pool; off for D = 0 whatever W and V."""
    d, w, v = (int(x) for x in shape)
    if d < 0 or w < 1 or v < 1:
        raise DraftGymError(f"bad shape {tuple(shape)}: D >= 0, W >= 1 and V >= 1")
    return OFF if d == 0 else StepShape(d, w, v).effective


def chain(k: int) -> StepShape:
    """Chain of K drafts; K = 0 is off."""
    return OFF if k == 0 else canonical((k, 1, k + 1))


def is_chain(shape) -> bool:
    """Off or a chain: what vLLM and SGLang's adaptive mode can run (one beam, every draft verified)."""
    return canonical(shape).kind != "tree"


def chain_k(shape) -> int:
    """K of a chain (0 for off); ValueError for a tree."""
    if not is_chain(shape):
        raise ValueError(f"{label(shape)} is not a chain")
    return canonical(shape)[0]


def label(shape) -> str:
    """'off', 'chain:K' or 'tree:D,W,V' (StepShape.label of the canonical shape)."""
    return canonical(shape).label()


def parse(spec: str) -> StepShape:
    """'off' | 'chain:K' | 'tree:D,W,V' | 'D,W,V' -> a canonical shape (one-line error otherwise)."""
    s = str(spec).strip()
    try:
        if s == "off":
            return OFF
        if s.startswith("chain:"):
            k = int(s.removeprefix("chain:"))
            if k < 0:
                raise ValueError("K must be >= 0")
            return chain(k)
        parts = [int(x) for x in s.removeprefix("tree:").split(",")]
        if len(parts) != 3:
            raise ValueError("a tree is D,W,V")
        return canonical(parts)
    except (ValueError, DraftGymError) as e:
        raise DraftGymError(f"bad shape {spec!r} ({e}): use off, chain:K or tree:D,W,V") from None


# -- a batch-size schedule's ranges: the one rule of the engine's ScheduleController and the replay's Schedule

def batch_ranges(ranges) -> list[tuple[int, int | None, StepShape]]:
    """[(lo, hi, shape)] checked by one rule: inclusive ranges that, sorted by lo, cover B = 1, 2, ...
    without gaps or overlaps; only the last may be open (hi None). Beyond a closed last range its shape
    holds (`shape_for_batch`), as vLLM's per-batch-size list and SGLang's tiers do. A one-line error
    names the ranges otherwise."""
    rs = sorted(((int(lo), None if hi is None else int(hi), StepShape.of(s)) for lo, hi, s in ranges),
                key=lambda r: r[0])
    if not rs:
        raise DraftGymError("a batch-size schedule needs at least one range")
    nxt = 1
    for lo, hi, _ in rs:
        if nxt is None or lo != nxt or (hi is not None and hi < lo):
            raise DraftGymError(f"batch-size schedule {[(lo, hi) for lo, hi, _ in rs]}: ranges must cover "
                                f"1, 2, ... without gaps or overlaps")
        nxt = None if hi is None else hi + 1
    return rs


def shape_for_batch(ranges, batch: int) -> StepShape:
    """The shape of batch size `batch` under checked `ranges` (batch_ranges): its range's, else the last's."""
    return next((s for lo, hi, s in ranges if lo <= batch and (hi is None or batch <= hi)), ranges[-1][2])
