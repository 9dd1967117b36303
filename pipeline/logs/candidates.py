"""The positions table's compact layout (schema version 3): what is stored, and how it turns back into
the per-level candidate scores every reader used before.

At a root, forward d of the draft scores W x W candidates (W after forward 1); the next W beams are
the best W of them (`pipeline.decode.tree.expand_level`). What replay and the observations read of
the candidates is, per level, their scores sorted best first with everything below SCORE_FLOOR (and
every missing slot) at SCORE_FLOOR (`simulator.observations.paper.sort_levels`). So a level is stored
as two parts:

    beam_scores    [Dmax, W]        float32  the best W of the level (exact, as version 2 stored them)
    candidate_tail [Dmax, W*W - W]  float16  the other W*W - W, sorted best first, floored at SCORE_FLOOR

    sorted level d = sort_desc(clean(beam_scores[d]) ++ candidate_tail[d])        [W*W] float32

Version 2 stored every level's W*W candidates unsorted in float32 (4,800 bytes a position at W = 10,
Dmax = 12, two thirds of a row); the tail in float16 is 2,160 bytes before compression, and at level 1
(W candidates only) it is all floor, which compresses to nothing. The tail is rounded down (to the
float16 at or below x): 0 <= x - tail <= ulp(x) <= 2^-10 |x| for x in [SCORE_FLOOR, 0], i.e. <= 0.0156
at the floor (log-probs below -16, probabilities < 1e-7), <= 0.00098 above -1. Rounding down keeps
every tail value at or below the level's worst beam, so the sorted level's first W entries are the
beams exactly; the beams, which every heuristic and RADAR read, are not rounded at all.

`pipeline.logs.schema.positions_table` builds a version-3 table with `candidate_tail`; readers get
[n, Dmax, W*W] float32 sorted levels from either version with `sorted_levels` / `levels_from_v2`.
"""
from __future__ import annotations

import numpy as np

SCORE_FLOOR = -20.0          # log-prob floor and padding value: exp(-20) ~ 2e-9, "no candidate"
_FLOOR32, _ZERO32 = np.float32(SCORE_FLOOR), np.float32(0.0)


def clean(scores: np.ndarray) -> np.ndarray:
    """float32 copy with NaN / -inf / below-floor -> SCORE_FLOOR and above 0 -> 0 (rounding)."""
    # maximum maps -inf to the floor, minimum +inf to 0; NaN passes both and is set afterwards
    s = np.minimum(np.maximum(np.asarray(scores, np.float32), _FLOOR32), _ZERO32)
    s[np.isnan(s)] = SCORE_FLOOR
    return s


def sort_desc(scores: np.ndarray) -> np.ndarray:
    """clean, then sort descending along the last axis (float32)."""
    s = clean(scores)
    s.sort(axis=-1)
    return np.ascontiguousarray(s[..., ::-1])


def candidate_tail(candidate_scores: np.ndarray, width: int) -> np.ndarray:
    """[..., Dmax, W*W] candidate scores (any order, NaN where missing) -> [..., Dmax, W*W - W] float16:
    each level's candidates ranked W+1 .. W*W, best first, floored, rounded down (module doc)."""
    x = sort_desc(candidate_scores)[..., width:]
    t = x.astype(np.float16)
    up = t.astype(np.float32) > x                     # rounded up: take the float16 just below instead
    t[up] = np.nextafter(t[up], np.float16(-np.inf))
    return t


def sorted_levels(beam_scores: np.ndarray, tail: np.ndarray) -> np.ndarray:
    """Version 3 -> [..., Dmax, W*W] float32 per-level sorted, cleaned candidate scores (module doc).

    The tail is stored sorted, floored and at or below the level's worst beam, so a level is its sorted
    beams followed by its tail: no sort of W*W values. Rows where that does not hold (beams that are not
    the level's best W) are sorted whole, so the result is sort_desc(beams ++ tail) either way."""
    W = beam_scores.shape[-1]
    out = np.empty(beam_scores.shape[:-1] + (W + tail.shape[-1],), np.float32)
    out[..., :W] = sort_desc(beam_scores)
    out[..., W:] = tail
    if tail.shape[-1]:
        bad = tail[..., 0] > out[..., W - 1]
        if bad.any():
            out[bad] = sort_desc(out[bad])
    return out


def levels_from_v2(candidate_scores: np.ndarray) -> np.ndarray:
    """Version 2's unsorted float32 [..., Dmax, W*W] -> the same per-level sorted, cleaned levels."""
    return sort_desc(candidate_scores)
