"""Exact replay of a serving step over B rows, and the closed batch: B rows always full.

The serving step (docs/design.md, "Serving at batch size B"): B active rows, each a logged
sequence at its own root position p_r, and one shape s = (D, W, V) for the whole step. Each row
takes its own logged acceptance for that shape (shapes.lookup_verify names the column)

    L_r = acceptance_W[row(seq_r, p_r), D - 1, index(V)]          (L_r = 0 when s is off)

emits e_r = min(L_r + 1, T_r - 1 - p_r) tokens and moves to p_r + L_r + 1; it is done once
p_r >= T_r - 1, exactly as the batch-1 replay (simulator/replay.py). Acceptance does not depend on
the batch; the cost does. The step is charged once for all rows, at the context that stands for
the batch (LatencyModel.step_context: the longest row's for DraftGym's engine, whose attention spans
the longest row; the mean for a paged engine's imported profile):

    t(s, B, c) = LatencyModel.t_step(D, W, V, c, batch=B),      c = max_r (or mean_r) context_len(row_r)

(at B = 1, c is the row's own context and t(s, 1, c) is the batch-1 replay's cycle time).

Closed batch (`closed_batch`): the requests are the logs' sequences cycled, R of them (default
max(S, 4 B)); B slots start full and a finished row's slot takes the next request at the step
boundary. The batch is held at B until a slot finds the queue empty: that step closes the window,
and the window's figures are the batch-B figures (the drain at the end, at smaller batches, is not
counted). Vectorised over candidate shapes and rows: one numpy pass per step for every shape at once.
At B = 1 with R = S every sequence runs once, so tau and the total time are the batch-1 replay's.
"""
from __future__ import annotations

import numpy as np

from pipeline.decode.step_shape import canonical, label
from pipeline.errors import DataError
from simulator.serving import metrics
from simulator.serving.inputs import lookup_verify


class ShapeTable:
    """A fixed list of shapes [A, 3] (effective D, W, V) over one set of logs: what a step needs to
    look up each row's L and to charge the step."""

    def __init__(self, logs, shapes):
        self.logs = logs
        self.shapes = [canonical(s) for s in shapes]
        if len(set(self.shapes)) != len(self.shapes):
            raise ValueError("duplicate shapes in a ShapeTable")
        a = np.array(self.shapes, np.int64).reshape(-1, 3)
        self.depth, self.width, self.verify = a[:, 0], a[:, 1], a[:, 2]                  # [A]
        grid_v = np.array([lookup_verify(logs, s) for s in self.shapes], np.int64)
        self.column = np.where(self.depth > 0, logs.grid_index(grid_v), -1)              # [A]
        self._index = {s: i for i, s in enumerate(self.shapes)}
        self._cost = {}                                   # (latency id, B) -> [A, K] step times at the context knots

    def __len__(self) -> int:
        return len(self.shapes)

    def index(self, shape) -> int:
        s = canonical(shape)
        if s not in self._index:
            raise DataError(f"shape {label(s)} is not in the replayed shape set")
        return self._index[s]

    def labels(self) -> list[str]:
        return [label(s) for s in self.shapes]

    def accepted(self, rows, a) -> np.ndarray:
        """L for log rows [n] under shape indices a ([n] or one int) -> [n] int64 (0 where off)."""
        rows = np.asarray(rows, np.int64)
        a = np.broadcast_to(np.asarray(a, np.int64), rows.shape)
        out = np.zeros(rows.shape, np.int64)
        on = self.depth[a] > 0
        for w in np.unique(self.width[a[on]]):
            m = on & (self.width[a] == w)
            out[m] = self.logs.w[int(w)].acceptance[rows[m], self.depth[a[m]] - 1, self.column[a[m]]]
        return out

    def step_time(self, latency, a, batch: int, context_len) -> np.ndarray:
        """Seconds of one step of shape(s) a over `batch` rows at (mean) context c (module docstring).

        The latency model is piecewise linear in c between the profile's context levels (each op's
        surface interpolates linearly in c, flat outside; the interpolation in B only weights the
        levels), so t(s, B, .) is tabulated once per (B, shape) at the union of those levels and read
        back with np.interp: the same numbers as LatencyModel.t_step, without re-evaluating every
        surface each step. A batch beyond the profiled ones (where the model takes a maximum) and a
        model without surfaces are evaluated directly."""
        a = np.asarray(a, np.int64)
        c = np.asarray(context_len, np.float64)
        knots = _context_knots(latency)
        if knots is None or batch > max(getattr(latency, "batch_levels", [1])):
            return latency.t_step(self.depth[a], self.width[a], self.verify[a], c, batch=batch)
        key = (id(latency), int(batch))
        if key not in self._cost:
            self._cost[key] = latency.t_step(self.depth[:, None], self.width[:, None], self.verify[:, None],
                                             knots[None, :], batch=batch)                    # [A, K]
        T = self._cost[key]
        if len(knots) == 1:
            return np.broadcast_to(T[a, 0], np.broadcast_shapes(a.shape, c.shape)).copy()
        x = np.clip(c, knots[0], knots[-1])
        hi = np.clip(np.searchsorted(knots, x, side="left"), 1, len(knots) - 1)
        w = (x - knots[hi - 1]) / (knots[hi] - knots[hi - 1])
        return (1 - w) * T[a, hi - 1] + w * T[a, hi]

    def row_step_time(self, latency, draft: int, rows_a, batch: int, context_len, flat: bool | None = None) -> float:
        """Seconds of one step whose rows verify different shapes (choosers.base.RowShapes): every row
        drafts shape `draft`'s D forwards of W beams, then one target forward verifies every row's own
        V_r (V_eff, 1 when off). What that forward costs depends on the engine, as the step's context
        does (LatencyModel.step_context):

            flat     a flattened-token verify (vLLM's, SGLang's: a paged engine, batch_context "mean")
                     costs what its sum_r V_r tokens cost, priced as B rows of the mean V-bar
            padded   DraftGym's engine (batch_context "max") verifies B rows of max_r V_r tokens

            t = D * t_draft(W, c, B) + t_verify(V-bar or max V, c, B) + t_overhead(c, B)

        (the verify surface interpolates linearly in V between profiled sizes). flat=None follows the
        profile's engine. With every row at the draft's own shape this is step_time's t(s, B, c)."""
        rows_a = np.asarray(rows_a, np.int64)
        d, w = int(self.depth[draft]), int(self.width[draft])
        on = self.depth[rows_a] > 0
        if (on & ((self.width[rows_a] != w) | (self.depth[rows_a] > d))).any():
            raise DataError(f"a row's shape is not a prefix of the drafted {label(self.shapes[draft])}")
        v = self.verify[rows_a]                          # canonical shapes: V_eff already, 1 when off
        flat = getattr(latency, "batch_context", "max") == "mean" if flat is None else flat
        c = np.asarray(context_len, np.float64)
        t = latency.t_verify(float(v.mean() if flat else v.max()), c, batch=batch) + latency.t_overhead(c, batch=batch)
        if d > 0:
            t = t + d * latency.t_draft(w, c, batch=batch)
        return float(t)

    def drafts(self, a) -> np.ndarray:
        """Draft tokens each row verifies under shape(s) a: V - 1 (0 when off)."""
        return self.verify[np.asarray(a, np.int64)] - 1


def _context_knots(latency) -> np.ndarray | None:
    """Every context level of every op surface of the model (at every batch level), or None."""
    try:
        surfs = [latency.draft, latency.verify, latency.overhead]
        surfs += [sf for lv in getattr(latency, "batched", {}).values() for sf in lv.values()]
        return np.unique(np.concatenate([np.asarray(sf.levels, np.float64) for sf in surfs]))
    except AttributeError:
        return None


def request_sequences(logs, n_requests: int) -> np.ndarray:
    """[R] the logged sequence each request replays: the split's sequences in order, cycled."""
    if logs.n_sequences == 0:
        raise DataError("no sequences to replay")
    return np.arange(n_requests) % logs.n_sequences


def closed_batch(logs, latency, table: ShapeTable, batch: int, n_requests: int | None = None,
                 shapes=None, context_edges=None) -> dict[str, np.ndarray]:
    """Every shape of `table` (or the indices `shapes`) held for a whole closed batch of B rows
    (module docstring). Returns per shape [A]: tokens, time (s), row_steps, steps, tokens_per_s,
    tau, drafts_per_step (draft tokens verified per row-step). With context_edges [K - 1] (increasing)
    also "tokens_by_context" and "time_by_context" [A, K]: the same sums split by the bin of each
    step's context (bin k: edges[k - 1] <= c < edges[k]; simulator/serving/context_axis.py)."""
    B = int(batch)
    S = logs.n_sequences
    R = int(n_requests) if n_requests is not None else max(S, 4 * B)
    if R < B:
        raise DataError(f"{R} requests cannot fill a closed batch of {B}")
    req_seq = request_sequences(logs, R)
    target = logs.new_tokens - 1
    idx = np.arange(len(table)) if shapes is None else np.asarray(shapes, np.int64)
    A = len(idx)
    seq = np.tile(req_seq[:B], (A, 1))                             # [A, B] sequence in each slot
    p = np.zeros((A, B), np.int64)                                 # [A, B] root position of each slot
    nxt = np.full(A, B, np.int64)                                  # next request id per shape
    tokens, time, row_steps, steps = (np.zeros(A) for _ in range(4))
    live = np.arange(A)                                            # shapes whose window is open
    edges = None if context_edges is None else np.asarray(context_edges, np.float64)
    if edges is not None:
        tok_c, time_c = np.zeros((A, len(edges) + 1)), np.zeros((A, len(edges) + 1))
    while len(live):
        s, pp = seq[live], p[live]                                 # [n, B]
        rows = logs.offsets[s] + pp
        a = np.repeat(idx[live], B).reshape(len(live), B)
        L = table.accepted(rows.ravel(), a.ravel()).reshape(len(live), B)
        c = latency.step_context(logs.context_len[rows])
        dt = table.step_time(latency, idx[live], B, c)
        emitted = np.minimum(L + 1, target[s] - pp)
        if edges is not None:
            k = np.searchsorted(edges, c, side="right")
            np.add.at(tok_c, (live, k), emitted.sum(1))
            np.add.at(time_c, (live, k), dt)
        tokens[live] += emitted.sum(1)
        time[live] += dt
        row_steps[live] += B
        steps[live] += 1
        pp = pp + L + 1
        fin = pp >= target[s]
        k = np.cumsum(fin, 1) - 1 + nxt[live][:, None]            # the request a finished slot takes
        refill = fin & (k < R)
        seq[live] = np.where(refill, req_seq[np.minimum(k, R - 1)], s)
        p[live] = np.where(refill, 0, pp)
        nxt[live] += fin.sum(1)
        live = live[~(fin & ~refill).any(1)]                      # a slot left empty closes the window
    drafted = row_steps * table.drafts(idx)
    extra = {} if edges is None else {"tokens_by_context": tok_c, "time_by_context": time_c}
    return {**extra, "shapes": idx, "tokens": tokens, "time": time, "row_steps": row_steps, "steps": steps,
            "tokens_per_s": metrics.tokens_per_s(tokens, time), "tau": metrics.tau(tokens, row_steps),
            "drafts_per_step": metrics.drafts_per_step(drafted, row_steps)}
