"""Reference walks and observation builders the tests compare the package against (only tests and the
docs/adhoc scripts use them)."""
from __future__ import annotations

import numpy as np

from pipeline.logs.schema import DEFAULT_MAX_DEPTH, DEFAULT_VERIFY_GRID
from simulator.observations import paper


def replay_static(acceptance: np.ndarray, new_tokens: int, depth: int, verify_size: int,
                  verify_grid=DEFAULT_VERIFY_GRID) -> list[tuple[int, int]]:
    """Walk one sequence's log with a static (D, V): [(p, L), ...] cycle by cycle.
    acceptance: [n_positions, max_depth, n_grid] for one width, rows indexed by position."""
    v = list(verify_grid).index(verify_size)
    p, out = 0, []
    while p < new_tokens - 1:
        L = int(acceptance[p, depth - 1, v])
        out.append((p, L))
        p += L + 1
    return out


def ltd_depth_obs_from_step(step) -> np.ndarray:
    """One LTD depth observation from a `pipeline.decode.tree.DraftStep` (what the engine's depth hook receives)."""
    return paper.ltd_depth_obs(paper.to_numpy(step.candidate_scores), step.depth, step.context_len, step.width)


def resps_obs_from_record(last, prev_root_scores, context_len: int, max_depth: int = DEFAULT_MAX_DEPTH) -> np.ndarray:
    """One Re-SpS observation from a row's previous cycle (a CycleRecord or None) and the
    depth-1 scores kept from the previous `verify_size(pool, ...)` call (pool.scores[0, :W])."""
    if last is None:
        return paper.resps_obs(np.zeros(paper.RESPS_ROOT_K), 0, 0, 0, 0, 0, context_len, 0, max_depth)
    return paper.resps_obs(paper.to_numpy(prev_root_scores), last.accepted, last.depth, last.verify_size, last.width,
                       last.emitted, context_len, 1, max_depth)
