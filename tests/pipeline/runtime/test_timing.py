"""Timing on asynchronous devices: every clock read syncs first, so queued work lands in its own region.

A fake asynchronous device: a kernel launch only queues its cost; the clock advances by the queued
cost when (and only when) the device is synced. On such a device the engine's old timers (read the
clock, call the controller, then sync) booked the head's queued draft forwards as controller time.
"""
from __future__ import annotations

import pytest

from pipeline.decode.controller import Controller, StaticController
from pipeline.decode.engine.core import BatchEngine
from pipeline.decode.engine.single import Engine
from pipeline.models.head import random_head
from pipeline.models.target import base_model
from pipeline.runtime.clock import DeviceClock

DRAFT_S, TARGET_S, POLICY_S = 0.005, 0.020, 0.001


class FakeAsyncDevice:
    """now: the device clock; queued: launched, not yet run. Only sync() runs the queue."""

    def __init__(self):
        self.now, self.queued, self.syncs = 0.0, 0.0, 0

    def launch(self, seconds: float) -> None:
        self.queued += seconds

    def sync(self) -> None:
        self.now += self.queued
        self.queued = 0.0
        self.syncs += 1

    def read(self) -> float:
        return self.now


def async_engine(model, head, dev: FakeAsyncDevice) -> Engine:
    eng = Engine(model, head)
    body = base_model(model)             # every target forward runs it once (the AR prefill calls it directly)
    head_fwd, body_fwd = head.forward, body.forward

    def head_forward(*a, **kw):          # one draft forward: queued, returns at once
        dev.launch(DRAFT_S)
        return head_fwd(*a, **kw)

    def body_forward(*a, **kw):          # one target forward (prefill or verify)
        dev.launch(TARGET_S)
        return body_fwd(*a, **kw)

    head.forward, body.forward = head_forward, body_forward
    eng.clock = DeviceClock("cpu", sync_fn=dev.sync, read_fn=dev.read)   # the one engine's clock
    return eng


class GpuPolicy(Controller):
    """A depth policy whose every call launches device work of its own (a policy net on the GPU)."""

    def __init__(self, dev: FakeAsyncDevice, stop_at: int):
        super().__init__(StaticController(8, 4, 20).shape)
        self.dev, self.stop_at, self.calls = dev, stop_at, 0

    def continue_drafting(self, step) -> bool:
        self.dev.launch(POLICY_S)
        self.calls += 1
        return step.depth < self.stop_at


@pytest.fixture()
def fresh_tiny():
    from tests.conftest import make_tiny_llama

    model = make_tiny_llama(seed=1)
    return model, random_head(model, seed=2)


def test_static_draft_time_lands_in_t_draft(fresh_tiny):
    model, head = fresh_tiny
    dev = FakeAsyncDevice()
    eng = async_engine(model, head, dev)
    res = eng.generate([1, 2, 3, 4, 5], max_new_tokens=12, controller=StaticController(4, 3, 10))
    assert res.cycles
    for c in res.cycles:
        # D draft forwards (forward 1 over the pending entries + D-1 expansions), nothing else
        assert c.t_draft == pytest.approx(DRAFT_S * c.depth, abs=1e-12)
        assert c.t_verify == pytest.approx(TARGET_S, abs=1e-12)
        assert c.t_controller == pytest.approx(0.0, abs=1e-12)     # the static controller queues nothing
        assert c.t_cycle == pytest.approx(c.t_draft + c.t_verify, abs=1e-12)
    assert res.prefill_s == pytest.approx(TARGET_S + DRAFT_S, abs=1e-12)   # target prefill + head prefill
    assert res.wall_s == pytest.approx(res.prefill_s + sum(c.t_cycle for c in res.cycles), abs=1e-12)


def test_policy_time_lands_in_t_controller(fresh_tiny):
    model, head = fresh_tiny
    dev = FakeAsyncDevice()
    eng = async_engine(model, head, dev)
    pol = GpuPolicy(dev, stop_at=3)
    res = eng.generate([3, 1, 4, 1, 5], max_new_tokens=12, controller=pol)
    assert pol.calls == 3 * len(res.cycles)            # asked after forwards 1, 2 and 3; stops at 3
    for c in res.cycles:
        assert c.depth == 3
        assert c.t_draft == pytest.approx(DRAFT_S * 3, abs=1e-12)
        assert c.t_controller == pytest.approx(POLICY_S * 3, abs=1e-12)


def test_ar_wall_time_is_every_forward(fresh_tiny):
    model, head = fresh_tiny
    dev = FakeAsyncDevice()
    eng = async_engine(model, head, dev)
    res = eng.generate_ar([1, 2, 3], max_new_tokens=6)
    assert res.prefill_s == pytest.approx(TARGET_S, abs=1e-12)
    assert res.wall_s == pytest.approx(6 * TARGET_S, abs=1e-12)   # prefill + 5 one-token steps


def test_time_op_syncs_around_each_call(monkeypatch):
    """The profile's micro-benchmark timer uses the same synced clock."""
    from pipeline.profiling import timed_ops

    dev = FakeAsyncDevice()
    monkeypatch.setattr(timed_ops, "DeviceClock", lambda device: DeviceClock(device, sync_fn=dev.sync, read_fn=dev.read))
    st = timed_ops.time_op(lambda: dev.launch(0.003), "cpu", warmup=1, repeats=4)
    assert st["median"] == pytest.approx(0.003) and st["n"] == 4


def test_marks_time_the_phases_without_a_sync_per_phase(fresh_tiny):
    """The step's phase boundaries as CUDA events (faked: a mark is when the device's queue gets there,
    now + queued, and it does not sync): the phases land exactly as with synced reads, and the steps
    add no sync at all, only the call's own clock reads do (its start and end, the prefill)."""
    model, head = fresh_tiny
    syncs, cycles = [], []
    for n in (6, 16):
        dev = FakeAsyncDevice()
        eng = async_engine(model, head, dev)
        eng.clock = DeviceClock("cpu", sync_fn=dev.sync, read_fn=dev.read, mark_fn=lambda: dev.now + dev.queued)
        res = eng.generate([1, 2, 3, 4, 5], max_new_tokens=n, controller=StaticController(4, 3, 10))
        for c in res.cycles:
            assert c.t_draft == pytest.approx(DRAFT_S * c.depth, abs=1e-12)
            assert c.t_verify == pytest.approx(TARGET_S, abs=1e-12)
            assert c.t_controller == pytest.approx(0.0, abs=1e-12)
            assert c.t_cycle == pytest.approx(c.t_draft + c.t_verify, abs=1e-12)
        assert res.wall_s == pytest.approx(res.prefill_s + sum(c.t_cycle for c in res.cycles), abs=1e-12)
        syncs.append(dev.syncs)
        cycles.append(len(res.cycles))
    assert cycles[1] > cycles[0] >= 1 and syncs[1] == syncs[0]       # more steps, not one sync more


def test_cuda_clock_marks_are_events_and_cpu_marks_are_reads():
    assert isinstance(DeviceClock("cpu").mark(), float)
    fake = DeviceClock("cuda", sync_fn=lambda: None, read_fn=lambda: 2.5)     # fakes stay reads
    assert fake.mark() == 2.5 and DeviceClock.seconds(1.0, 2.5) == 1.5


def test_an_untimed_step_has_the_same_outputs_and_no_times(fresh_tiny):
    """BatchEngine.timed = False (what the GPU check compares a timed call with): no marks, the same
    tokens and shapes, the step records' times left at 0."""
    model, head = fresh_tiny
    eng = BatchEngine(model, head)
    timed = eng.generate([[1, 2, 3], [4, 5, 6, 7]], 10, batch_size=2)
    eng.timed = False
    untimed = eng.generate([[1, 2, 3], [4, 5, 6, 7]], 10, batch_size=2)
    assert [r.output_ids for r in untimed.rows] == [r.output_ids for r in timed.rows]
    assert [s.accepted for s in untimed.steps] == [s.accepted for s in timed.steps]
    assert all(s.t_step > 0 and s.t_verify > 0 for s in timed.steps)
    assert all(s.t_step == s.t_draft == s.t_verify == s.t_controller == 0 for s in untimed.steps)
    assert untimed.wall_s > 0
