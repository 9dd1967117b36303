"""Serving shapes: one speculation setting shared by every row of a step, written (D, W, V).

    off          (0, 1, 1)        a plain AR step: no draft, a 1-token verify per row
    chain K      (K, 1, K + 1)    K draft forwards of one beam, all K drafts verified (vLLM's K,
                                  SGLang's num_steps with topk = 1)
    tree         (D, W, V)        EAGLE-3's tree: D forwards of W beams, the V - 1 best of the
                                  pool of W + (D - 1) W^2 candidates verified with the root

A shape is kept in its effective form (V clamped to 1 + pool size, as the engine clamps it), so
that (3, 1, 8) and (3, 1, 4) are the same chain. Spelling on the command line and in JSON:
"off", "chain:K", "tree:D,W,V" (or "D,W,V").

Acceptance of a shape at a logged position is read from the width-W acceptance table at the
column of V (docs/design.md, "Exact counterfactual replay"). V must be on the logged grid, with one
exact exception: a shape that verifies its whole pool (every chain) accepts the same L at every
V >= 1 + pool, so its column is the smallest grid V >= 1 + pool (chain 2 = (2, 1, 3) reads V = 4).
"""
from __future__ import annotations

import numpy as np

from pipeline.decode.controller import StepShape, pool_size
from pipeline.errors import DataError, DraftGymError

Shape = StepShape                       # the one shape type (pipeline/decode/controller.py): a (D, W, V) tuple
OFF: Shape = StepShape.off()
CHAIN_KS = tuple(range(1, 9))           # the chains every candidate set tries (vLLM's K = 1..8)
pool = pool_size                        # W + (D - 1) W^2 draft candidates (0 when off)


def canonical(shape) -> Shape:
    """(D, W, V) with V clamped to 1 + pool; off for D = 0 whatever W and V."""
    d, w, v = (int(x) for x in shape)
    if d < 0 or w < 1 or v < 1:
        raise DraftGymError(f"bad shape {tuple(shape)}: D >= 0, W >= 1 and V >= 1")
    return OFF if d == 0 else StepShape(d, w, v).effective


def chain(k: int) -> Shape:
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


def parse(spec: str) -> Shape:
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


# ------------------------------------------------------------------ what the logs can replay

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
    if v == 1 + pool(d, w) and (grid >= v).any():
        return int(grid[grid >= v].min())
    raise DataError(f"{label(shape)}: V = {v} is not on the logged grid {grid.tolist()}")


def replayable(logs, shape) -> bool:
    try:
        lookup_verify(logs, shape)
        return True
    except DataError:
        return False


def candidates(logs, which: str = "all") -> list[Shape]:
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
