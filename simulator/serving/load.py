"""Continuous batching under load: requests arrive, wait in a queue, decode in a batch of at most
`max_batch` rows, and leave, every step replayed exactly (simulator/serving/replay.py).

Event loop (one iteration = one step boundary at time t):

    1. admit: queued requests that have arrived (arrival <= t) take the free slots, first come first
       served; each is prefilled alone before the next step (as the engines do: a batch-1 prefill
       of its n prompt tokens, t += t_prefill(n), when the profile has prefill rows), and requests
       arriving meanwhile join at the same boundary; a request's join time is when its prefill starts.
    2. if no row is active, jump t to the next arrival and admit again.
    3. the chooser picks one shape s for the B active rows (choosers/base.py); each row r takes its
       logged L_r(s), emits e_r = min(L_r + 1, left_r), advances by L_r + 1; the step costs
       t(s, B, c) at the batch's step context c (LatencyModel.step_context) (+ the chooser's own
       cost, Chooser.extra_time) and t += t(s, B, c). A chooser may instead give each row its own
       shape under one drafted shape (RowShapes: per-request budgets); row r then takes L_r(s_r) and
       the step costs ShapeTable.row_step_time. A step's shape (step_shape) is the drafted one.
    4. rows that are done leave (finish time t); their slots are free at the next boundary.

Switching and its price (`SwitchPrice`, default free). An engine prepares one state per shape (a
CUDA graph per step count in SGLang's adaptive rule; vLLM's per-batch-size K) and pays for moving
between them, and one configured for speculation pays for an "off" step more than a plain decoder:

    t_step <- t_step * off_factor       when the step is off (vLLM with K = 0 inside a speculative
                                        config: the drafter's bookkeeping still runs)
    t_step <- t_step + switch_s          when the step's shape differs from the previous step's

Both are properties of the engine being modelled, set by the user (serve-eval --switch-ms,
--off-factor) from a measurement such as `draftgym vllm-run`'s; the replay counts switches either way
(metrics.summarize: switches, switches/s).

So the batch size moves with the load: a few rows at low arrival rates, up to max_batch when the
queue builds. Arrivals during a step wait for its end (the engine admits between steps). All
arrivals at t = 0 with max_batch = B is a closed batch that drains at the end; with max_batch = 1
it replays every sequence once, one after the other: the batch-1 replay's tau and total time.

Vectorised over the active rows; the loop is over steps. `ServingResult` keeps per request the
arrival, join and finish times and tokens, and per step the time, batch size, shape and tokens;
metrics.summarize turns it into the serving figures.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.errors import DataError
from simulator.serving.choosers.base import Chooser, RowShapes, StepView
from simulator.serving.replay import ShapeTable, request_sequences


@dataclass(frozen=True)
class SwitchPrice:
    """What the modelled engine charges for switching (module docstring)."""
    switch_s: float = 0.0        # s added to a step whose shape differs from the previous step's
    off_factor: float = 1.0      # an off step costs this many times the profiled AR step

    def __post_init__(self):
        if self.switch_s < 0 or self.off_factor <= 0:
            raise DataError(f"switch price must be >= 0 s and the off factor > 0, got {self.switch_s}, {self.off_factor}")


@dataclass
class ServingResult:
    name: str
    shapes: list                 # the ShapeTable's shapes (step_shape indexes them)
    seq: np.ndarray              # [R] logged sequence of each request
    arrival: np.ndarray          # [R] s
    join: np.ndarray             # [R] s, when the request took a slot
    finish: np.ndarray           # [R] s
    tokens: np.ndarray           # [R] tokens emitted (T - 1 of its sequence)
    cycles: np.ndarray           # [R] steps the request was in
    step_start: np.ndarray       # [N] s
    step_time: np.ndarray        # [N] s
    step_batch: np.ndarray       # [N] B
    step_shape: np.ndarray       # [N] index into shapes (the drafted shape of a per-row step)
    step_emitted: np.ndarray     # [N] tokens emitted by the whole batch
    step_drafted: np.ndarray     # [N] draft tokens verified by the whole batch, sum_r (V_r - 1)
    step_queued: np.ndarray      # [N] requests waiting at the step's start
    prefill: np.ndarray | None = None  # [R] s of each request's prefill (0 without prefill rows)
    row_trace: dict | None = None  # per row-step: request, shape, accepted, emitted (trace=True)


def serve(logs, latency, table: ShapeTable, chooser: Chooser, arrivals, max_batch: int,
          request_seq=None, trace: bool = False, max_steps: int | None = None, prefill: bool = True,
          price: SwitchPrice | None = None) -> ServingResult:
    """Replay requests arriving at `arrivals` ([R] s, non-decreasing) under `chooser` (module docstring).
    prefill=False leaves the prefills out even when the profile has them; `price` charges switches."""
    price = price or SwitchPrice()
    arrivals = np.asarray(arrivals, np.float64)
    R = len(arrivals)
    if R == 0:
        raise DataError("no requests to serve")
    if (np.diff(arrivals) < 0).any():
        raise DataError("arrival times must not decrease")
    if max_batch < 1:
        raise DataError(f"max_batch must be >= 1, got {max_batch}")
    seq_of = request_sequences(logs, R) if request_seq is None else np.asarray(request_seq, np.int64)
    target = (logs.new_tokens - 1)[seq_of]                          # [R] tokens each request emits
    pf = latency.t_prefill(logs.prompt_len[seq_of]) if prefill else np.zeros(R)   # [R] s of each prefill
    slot_req = np.full(max_batch, -1, np.int64)                     # request in each slot (-1 free)
    slot_p = np.zeros(max_batch, np.int64)                          # its root position
    join, finish = np.full(R, np.nan), np.full(R, np.nan)
    tokens, cycles = np.zeros(R, np.int64), np.zeros(R, np.int64)
    st = {k: [] for k in ("start", "time", "batch", "shape", "emitted", "drafted", "queued")}
    rt = {k: [] for k in ("request", "shape", "accepted", "emitted")} if trace else None
    chooser.reset(table, latency)
    t, q, last = 0.0, 0, None                                       # clock; next request to admit; last shape
    while q < R or (slot_req >= 0).any():
        while True:                                                 # 1. admit, first come first served
            arrived = int(np.searchsorted(arrivals, t, side="right"))
            free = np.flatnonzero(slot_req < 0)
            k = min(len(free), arrived - q)
            if k <= 0:
                break
            new = np.arange(q, q + k)
            slot_req[free[:k]], slot_p[free[:k]] = new, 0
            join[new] = t + np.concatenate([[0.0], np.cumsum(pf[new])[:-1]])     # one prefill after another
            t += float(pf[new].sum())
            q += k
        act = np.flatnonzero(slot_req >= 0)
        if not len(act):                                            # 2. idle until the next arrival
            t = max(t, float(arrivals[q]))
            continue
        req, p = slot_req[act], slot_p[act]                         # [B]
        rows = logs.offsets[seq_of[req]] + p
        B = len(act)
        view = StepView(batch=B, rows=rows, context_len=logs.context_len[rows], left=target[req] - p,
                        requests=req, time=t, queued=arrived - q)
        a = chooser.choose(view)                                    # 3. the step's shape(s)
        c = latency.step_context(view.context_len)
        if isinstance(a, RowShapes):
            row_a, step_a = np.asarray(a.rows, np.int64), int(a.draft)
            dt = table.row_step_time(latency, step_a, row_a, B, c)
        else:
            a = step_a = int(a)
            row_a = np.full(B, a)
            dt = float(table.step_time(latency, a, B, c))
        L = table.accepted(rows, row_a)
        if table.depth[step_a] == 0:
            dt *= price.off_factor
        if last is not None and step_a != last:
            dt += price.switch_s
        last = step_a
        dt += chooser.extra_time(view, a)
        e = np.minimum(L + 1, view.left)
        tokens[req] += e
        cycles[req] += 1
        for key, v in (("start", t), ("time", dt), ("batch", B), ("shape", step_a), ("emitted", int(e.sum())),
                       ("drafted", int(table.drafts(row_a).sum())), ("queued", view.queued)):
            st[key].append(v)
        if rt is not None:
            for key, v in (("request", req), ("shape", row_a), ("accepted", L), ("emitted", e)):
                rt[key].append(v)
        t += dt
        view.step_time = dt
        chooser.observe(view, a, L)
        p = p + L + 1                                               # 4. done rows leave
        done = p >= target[req]
        slot_p[act] = p
        finish[req[done]] = t
        slot_req[act[done]] = -1
        if max_steps is not None and len(st["time"]) >= max_steps:
            raise DataError(f"serving replay did not finish within {max_steps} steps")
    arr = lambda key, dt: np.asarray(st[key], dt)
    return ServingResult(name=chooser.name, shapes=list(table.shapes), seq=seq_of, arrival=arrivals, join=join,
                         finish=finish, tokens=tokens, cycles=cycles, step_start=arr("start", np.float64),
                         step_time=arr("time", np.float64), step_batch=arr("batch", np.int64),
                         step_shape=arr("shape", np.int64), step_emitted=arr("emitted", np.int64),
                         step_drafted=arr("drafted", np.int64), step_queued=arr("queued", np.int64),
                         prefill=np.asarray(pf, np.float64),
                         row_trace={k: np.concatenate(v) for k, v in rt.items()} if rt is not None else None)
