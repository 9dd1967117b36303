"""Requests arriving over time at the batched engine (pipeline/decode/engine/core.py, `arrivals=`):
rows join only once arrived, the batch grows and shrinks with the traffic, idle waits are skipped on
the call's clock, and every row is still its own batch-1 AR output in fp32. Then the stores under
it (kv.py BatchState): fixed slots that never move while rows join and leave, and with CUDA graphs
padded run rows (engine.py row_bucket); every row is still its batch-1 AR output (greedy) or its
unpadded run's (T > 0)."""
from __future__ import annotations

import itertools

import pytest
import torch

from pipeline.decode.controller import ScriptedController, StaticController
from pipeline.decode.engine.core import BatchEngine, row_bucket
from pipeline.decode.engine.kv import BatchState
from pipeline.decode.step_shape import StepShape
from pipeline.errors import DraftGymError
from tests.pipeline.decode.conftest import MIXED


class TickClock:
    """A clock that advances one 'second' per reading: arrivals land mid-run at known readings."""

    def __init__(self):
        self.t = itertools.count()

    def __call__(self) -> float:
        return float(next(self.t))

    mark = __call__                         # a step's phase marks are readings too (as DeviceClock's on a CPU)

    @staticmethod
    def seconds(a: float, b: float) -> float:
        return b - a


@pytest.fixture
def ticking(tiny, monkeypatch):
    eng, beng, prompts, ar = tiny
    monkeypatch.setattr(beng, "clock", TickClock())
    return beng, prompts, ar


def test_batch_grows_and_shrinks_with_arrivals_and_stays_lossless(ticking):
    """Two requests at 0, the rest arriving while they decode: the batch grows to batch_size through
    new slots, shrinks as the queue runs dry, and every row equals its batch-1 AR output."""
    beng, prompts, ar = ticking
    arrivals = [0, 0, 40, 45, 50, 60, 400, 410, 420, 430]
    res = beng.generate(prompts, 20, batch_size=4, controller=ScriptedController(MIXED), arrivals=arrivals)
    for r, a in zip(res, ar):
        assert r.output_ids == a.output_ids and r.stop_reason == a.stop_reason, r.index
    sizes = [s.batch_size for s in res.steps]
    assert max(sizes) == 4 and sizes[0] <= 2
    assert any(b > a for a, b in zip(sizes, sizes[1:])), "the batch never grew"
    assert any(b < a for a, b in zip(sizes, sizes[1:])), "the batch never shrank"
    for r in res:
        assert r.arrival_s == arrivals[r.index] and r.join_s >= r.arrival_s and r.finish_s >= r.join_s
    assert all(s.queued >= 0 for s in res.steps)


def test_idle_wait_is_skipped(ticking):
    """A request arriving long after the first finished: the call's clock jumps to its arrival
    (idle_s), it joins at once, and the wall time does not hold the wait."""
    beng, prompts, ar = ticking
    res = beng.generate_ar(prompts[:3], 20, batch_size=4, arrivals=[0, 0, 10_000])
    assert res.idle_s > 9_000 and res.wall_s < 1_000
    late = res.rows[2]
    assert late.join_s == pytest.approx(10_000, abs=5) and late.output_ids == ar[2].output_ids
    assert max(s.batch_size for s in res.steps if s.rows == [2]) == 1


def test_all_arriving_at_zero_is_the_closed_batch(tiny):
    """arrivals all 0 = no arrivals: the same rows, the same steps."""
    _, beng, prompts, _ = tiny
    ctl = lambda: StaticController(StepShape(3, 4, 10))
    a = beng.generate(prompts, 16, batch_size=3, controller=ctl())
    b = beng.generate(prompts, 16, batch_size=3, controller=ctl(), arrivals=[0.0] * len(prompts))
    assert [r.output_ids for r in a] == [r.output_ids for r in b]
    assert [(s.batch_size, s.rows, s.accepted) for s in a.steps] == [(s.batch_size, s.rows, s.accepted) for s in b.steps]


def test_bad_arrivals(tiny):
    _, beng, prompts, _ = tiny
    with pytest.raises(DraftGymError, match="non-decreasing"):
        beng.generate_ar(prompts[:3], 4, arrivals=[0, 2, 1])
    with pytest.raises(DraftGymError, match="2 arrival times for 3 prompts"):
        beng.generate_ar(prompts[:3], 4, arrivals=[0, 1])
    with pytest.raises(DraftGymError, match=">= 0"):
        beng.generate_ar(prompts[:2], 4, arrivals=[-1, 0])

class Watched(BatchEngine):
    """Records each step's (live rows, run rows, the stores' addresses) before it runs."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.seen = []

    def _step(self, state, rows, run, controller):
        self.seen.append((state.live, state.rows, state.buffers(), len(state.n_host), tuple(state.n.shape)))
        return super()._step(state, rows, run, controller)


def test_row_bucket_is_vllms_capture_sizes():
    assert [row_bucket(a) for a in (1, 2, 3, 4, 5, 8, 9, 16, 17, 24, 25, 64, 65)] == \
        [1, 2, 4, 4, 8, 8, 16, 16, 24, 24, 32, 64, 72]


@pytest.fixture
def padded(tiny):
    eng, beng, prompts, ar = tiny
    return Watched(beng.model, beng.head, beng.eos, pad_rows=True), beng, prompts, ar


def test_padded_rows_under_arrivals_are_lossless_and_the_stores_never_move(padded):
    """Rows join and leave with the traffic: each step runs over row_bucket(live) rows, the stores'
    addresses never change within the call (so a CUDA graph of a row count stays valid), and every
    row equals its batch-1 AR output; the records count the live rows only."""
    pe, _, prompts, ar = padded
    pe.clock = TickClock()
    arrivals = [0, 0, 40, 45, 50, 60, 400, 410, 420, 430]
    res = pe.generate(prompts, 20, batch_size=7, controller=ScriptedController(MIXED), arrivals=arrivals)
    for r, a in zip(res, ar):
        assert r.output_ids == a.output_ids and r.stop_reason == a.stop_reason, r.index
    lives = [s[0] for s in pe.seen]
    assert [s[1] for s in pe.seen] == [row_bucket(a) for a in lives]
    assert any(s[1] > s[0] for s in pe.seen), "no step ran with pad rows"
    assert len({s[2] for s in pe.seen}) == 1, "a store moved while rows joined or left"
    assert all(n == R and shape == (R,) for _, R, _, n, shape in pe.seen)
    assert [s.batch_size for s in res.steps] == lives and all(len(s.rows) == s.batch_size for s in res.steps)
    assert all(len(s.context_lens) == s.batch_size == len(s.accepted) for s in res.steps)


def test_padded_closed_batch_equals_unpadded(padded):
    """A closed batch whose rows leave one by one at the end: the same outputs, steps and accepted
    lengths as the engine without pad rows."""
    pe, beng, prompts, _ = padded
    ctl = lambda: StaticController(StepShape(3, 4, 10))
    a = pe.generate(prompts, 16, batch_size=6, controller=ctl())
    b = beng.generate(prompts, 16, batch_size=6, controller=ctl())
    assert [r.output_ids for r in a] == [r.output_ids for r in b]
    assert [(s.batch_size, s.rows, s.accepted) for s in a.steps] == [(s.batch_size, s.rows, s.accepted) for s in b.steps]
    runs = {R for _, R, *_ in pe.seen}
    assert 8 in runs and min(runs) < 8 and any(R > live for live, R, *_ in pe.seen)


def test_padded_sampling_equals_unpadded(padded):
    """T > 0: each row draws from its own generator, the pad rows from the engine's own, so the rows
    are those of the unpadded run with the same seeds."""
    pe, beng, prompts, _ = padded
    kw = dict(temperature=0.8, seeds=list(range(len(prompts))), batch_size=5,
              controller=StaticController(StepShape(3, 4, 10)))
    a = pe.generate(prompts, 12, **kw)
    b = beng.generate(prompts, 12, **{**kw, "controller": StaticController(StepShape(3, 4, 10))})
    assert [r.output_ids for r in a] == [r.output_ids for r in b]


def test_keep_moves_the_last_rows_into_the_holes(tiny):
    """keep([1, 3]) of 4 live rows: slot 1 stays, slot 3's row moves into slot 0 (in place), the
    host lengths follow, and the returned order says where each row came from."""
    _, beng, _, _ = tiny
    st = BatchState(beng.model, beng.head, 4, 16, True).alias(4)
    for s in range(4):
        st.ids[s] = s + 10
        st.feat[s] = float(s)
        st.kv.k[0][s] = float(s)
        st.n_host[s], st.dl_host[s] = 5 + s, 4 + s
    before = st.buffers()
    order = st.keep([1, 3])
    assert order == [3, 1] and st.live == st.rows == 2 and st.buffers() == before
    assert st.ids[:, 0].tolist() == [13, 11] and st.feat[:, 0, 0].tolist() == [3.0, 1.0]
    assert st.kv.k[0][:, 0, 0, 0].tolist() == [3.0, 1.0]
    assert st.n_host == [8, 6] and st.dl_host == [7, 5] and st.n.tolist() == [8, 6]


def test_pad_rows_hold_the_pad_length(tiny):
    """Three live rows padded to four: the pad row's n = dl = PAD on the host and the device."""
    _, beng, _, _ = tiny
    st = BatchState(beng.model, beng.head, 4, 16, True, pad=row_bucket).alias(3)
    assert (st.live, st.rows, st.n_host[3], st.dl_host[3]) == (3, 4, BatchState.PAD, BatchState.PAD)
    assert st.n.tolist()[3] == st.dl.tolist()[3] == BatchState.PAD
    st.add(2)                                              # 5 live: 8 run rows, the stores grown to 8 slots
    assert (st.live, st.rows, st.slots) == (5, 8, 8) and st.n_host[5:] == [BatchState.PAD] * 3


def test_stores_are_reused_by_a_smaller_call(tiny):
    """A call of fewer rows runs on the first slots of the last call's stores (no new stores)."""
    _, beng, prompts, _ = tiny
    beng.generate_ar(prompts, 4, batch_size=6)
    st = beng._static[False]
    addr = st.buffers()
    beng.generate_ar(prompts[:2], 4, batch_size=2)
    assert beng._static[False] is st and st.buffers() == addr
    assert torch.is_tensor(st.full["ids"][0])


def test_a_longer_call_of_fewer_rows_keeps_the_slots(tiny):
    """A batch-1 call that needs more capacity makes new stores with the old slot count, so the next
    call of many rows fits them (no new stores, and no new graphs on a GPU)."""
    _, beng, prompts, _ = tiny
    beng.release()
    beng.generate_ar(prompts, 4, batch_size=6)
    beng.generate_ar([prompts[0] * 20], 4, batch_size=1)
    st = beng._static[False]
    assert st.slots >= 6
    addr = st.buffers()
    beng.generate_ar(prompts, 4, batch_size=6)
    assert beng._static[False] is st and st.buffers() == addr
