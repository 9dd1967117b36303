"""The engine's device-dependent parts, run on the device named by $DRAFTGYM_TEST_DEVICE (marker `gpu`).

CI runs them on the CPU (the variable unset); `python -m tools.gpu_check` runs them on CUDA
(`DRAFTGYM_TEST_DEVICE=cuda pytest -m gpu`), where kernels, asynchronous launches and bf16 matmuls
differ from the CPU's. Each test is what the GPU could break:

- the engine: greedy EAGLE-3 output equals AR output in fp32, for trees, chains and V = 1;
- lossless in bf16: every divergence from AR is a rounding near-tie (pipeline/decode/lossless.py);
- timing: a DeviceClock read returns only after the device has run everything queued, the
  engine's per-cycle times add up inside the cycle, and a step's phase marks are CUDA events; on CUDA, a draft level costs about the same at
  depth 5 as at depth 2 (the SDPA kernels chosen: cuDNN's re-planning made deep drafts dear);
- batched generation: every row equals batch-1 AR (fp32), or parts from it at a near-tie (bf16);
- the batched engine's CUDA graphs: captured without a failure and replayed, the same tokens and
  accepted lengths as the same engine with graphs off (on the CPU both are eager);
- the head forward in bf16: close to the fp32 forward, the KVBuffer path equal to the
  concatenated past, grouped-query attention equal to SDPA over repeated keys.
"""
from __future__ import annotations

import os

import pytest
import torch

from pipeline.decode.continuations import generate_batch
from pipeline.decode.controller import StaticController
from pipeline.decode.engine.core import BatchEngine
from pipeline.decode.engine.single import Engine
from pipeline.decode.lossless import classify
from pipeline.decode.step_shape import StepShape
from pipeline.models.head import random_head
from pipeline.runtime.clock import DeviceClock
from tests.conftest import make_tiny_llama

pytestmark = pytest.mark.gpu
TEST_DEVICE_ENV = "DRAFTGYM_TEST_DEVICE"          # tools.gpu_check.pytest_step sets it
SHAPES = [(8, 10, 60), (5, 1, 6), (1, 1, 1)]    # (D, W, V): EAGLE-3's default tree, a chain, AR-like


@pytest.fixture(scope="module")
def device() -> torch.device:
    dev = torch.device(os.environ.get(TEST_DEVICE_ENV, "cpu"))
    if dev.type == "cuda" and not torch.cuda.is_available():
        pytest.skip(f"{TEST_DEVICE_ENV}={dev} but torch sees no CUDA device")
    return dev


def tiny(device, dtype=torch.float32, seed=0, vocab=64):
    return make_tiny_llama(vocab=vocab, hidden=32, seed=seed).to(device=device, dtype=dtype)


def prompts(n: int, vocab: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (int(torch.randint(1, 14, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


def test_engine_lossless_fp32(device):
    """fp32 is the strict rule: the same tokens as AR, for every tree shape."""
    model = tiny(device)
    eng = Engine(model, random_head(model, seed=3))
    for p in prompts(2, 64):
        ar = eng.generate_ar(p, 20).output_ids
        for shape in SHAPES:
            sp = eng.generate(p, 20, controller=StaticController(*shape))
            assert sp.output_ids == ar, (shape, p)
            assert sum(c.emitted for c in sp.cycles) + 1 == 20


def test_engine_lossless_bf16_near_ties_only(device):
    """bf16: EAGLE-3 output vs AR is exact or a near-tie, never a mismatch; with a tiny vocabulary
    random drafts are often right, so accepted paths (L > 0) are exercised too."""
    model = tiny(device, torch.bfloat16, seed=2, vocab=6)
    eng = Engine(model, random_head(model, seed=0))
    accepted = 0
    for p in prompts(2, 6, seed=1):
        ar = eng.generate_ar(p, 24).output_ids
        for shape in SHAPES[:2]:
            sp = eng.generate(p, 24, controller=StaticController(*shape))
            v = classify(model, p, ar, sp.output_ids)
            assert v.status in ("exact", "near-tie"), (shape, p, v)
            accepted += sum(c.accepted for c in sp.cycles)
    assert accepted > 0


def test_clock_read_waits_for_queued_work(device):
    """After a clock read nothing launched before it is still running (on CUDA: the stream is idle),
    and time_op's statistics are ordered."""
    from pipeline.profiling.timed_ops import time_op

    clock = DeviceClock(device)
    a = torch.randn(512, 512, device=device)
    t0 = clock()
    for _ in range(20):
        a = torch.tanh(a @ a)
    t1 = clock()
    if device.type == "cuda":
        assert torch.cuda.current_stream(device).query()
    assert t1 > t0
    s = time_op(lambda: a @ a, device, warmup=1, repeats=5)
    assert s["n"] == 5 and 0 < s["p10"] <= s["median"] <= s["p90"]


def test_cycle_times_add_up(device):
    """Every cycle's draft, verify and controller times are positive and fit inside its t_cycle; the
    cycles fit inside the generation's wall time."""
    model = tiny(device, seed=1)
    eng = Engine(model, random_head(model, seed=2))
    res = eng.generate(prompts(1, 64)[0], 16, controller=StaticController(4, 3, 10))
    for c in res.cycles:
        assert c.t_draft > 0 and c.t_verify > 0 and c.t_controller >= 0
        assert c.t_draft + c.t_verify + c.t_controller <= c.t_cycle * (1 + 1e-9)
    assert sum(c.t_cycle for c in res.cycles) <= res.wall_s


def test_step_times_come_from_marks_and_add_up(device):
    """A step's phase boundaries are marks (CUDA events on a GPU, clock reads on a CPU); the step times
    read from them at the call's end are positive and fit inside t_step, and an untimed call (no
    marks) gives the same tokens with its times left at 0."""
    model = tiny(device, seed=3)
    eng = BatchEngine(model, random_head(model, seed=3))
    assert isinstance(eng.clock.mark(), torch.cuda.Event if device.type == "cuda" else float)
    ps, ctl = prompts(3, 64, seed=7), StaticController(StepShape(4, 3, 10))
    res = eng.generate(ps, 16, batch_size=3, controller=ctl)
    for s in res.steps:
        assert s.t_draft > 0 and s.t_verify > 0 and s.t_controller >= 0
        assert s.t_draft + s.t_verify + s.t_controller <= s.t_step * (1 + 1e-6)
    eng.timed = False
    untimed = eng.generate(ps, 16, batch_size=3, controller=ctl)
    assert [r.output_ids for r in untimed.rows] == [r.output_ids for r in res.rows]
    assert all(s.t_step == 0 for s in untimed.steps)


def test_draft_level_cost_does_not_grow_with_depth(device):
    """The SDPA kernels chosen (pipeline/runtime/attention_backends.py): a draft level costs about the
    same at every depth. cuDNN's attention, torch's default on Hopper, re-planned for every new key
    span and made an H100's depth-8 draft 21x its chosen-kernel cost; per level, a depth-5 draft must
    cost at most 3x a depth-2 draft. Timed on CUDA only (the suite times nothing on a CPU)."""
    if device.type != "cuda":
        pytest.skip("a timing check for CUDA devices (tools.gpu_check.run runs it)")
    model = tiny(device, torch.bfloat16, vocab=256)
    eng = Engine(model, random_head(model, seed=2))
    prompt = prompts(1, 256, seed=5)[0] * 20                     # up to 260 tokens of context
    per_level = {}
    for depth in (2, 5):
        eng.generate(prompt, 8, controller=StaticController(depth, 10, 30))              # warm-up
        cycles = eng.generate(prompt, 48, controller=StaticController(depth, 10, 30)).cycles
        per_level[depth] = sorted(c.t_draft / c.depth for c in cycles)[len(cycles) // 2]
    assert per_level[5] <= 3 * per_level[2], per_level


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_batched_generation_equals_batch1(device, dtype):
    """Slots of mixed lengths with refills (7 prompts, 3 rows): fp32 rows equal batch-1 AR token for
    token; bf16 rows part from it only at near-ties."""
    model = tiny(device, dtype, seed=4)
    eng = Engine(model, None)
    ps = prompts(7, 64, seed=5)
    rows = generate_batch(model, ps, 20, batch_size=3)
    for p, r in zip(ps, rows):
        ar = eng.generate_ar(p, 20).output_ids
        if dtype == torch.float32:
            assert r.output_ids == ar, p
        else:
            assert classify(model, p, ar, r.output_ids).status in ("exact", "near-tie"), p


def test_head_forward_bf16(device):
    """The head in bf16 computes what it computes in fp32, to bf16 precision: outputs within 5 % of
    the fp32 forward's size (a wrong cast or norm moves them by O(1)), of dtype bf16 and finite; the
    KVBuffer path equals the concatenated past; grouped-query attention equals SDPA over repeated
    keys within 8 ulps of its largest output."""
    import torch.nn.functional as F

    from pipeline.models.head_model import KVBuffer, causal_mask, gqa_attention

    m32, m16 = tiny(device, seed=6), tiny(device, torch.bfloat16, seed=6)
    h32, h16 = random_head(m32, seed=7), random_head(m16, seed=7)
    cfg, g = h32.cfg, torch.Generator().manual_seed(8)
    B, S, W = 2, 9, 4
    pk, pv = (torch.randn(1, cfg.num_key_value_heads, S, cfg.dim_head, generator=g).to(device) for _ in range(2))
    toks = torch.randint(0, cfg.vocab_size, (B, W), generator=g).to(device)
    hidden = torch.randn(B, W, cfg.hidden_size, generator=g).to(device)
    pos = torch.full((B, W), S, device=device)
    past = lambda dt: (pk.to(dt).expand(B, -1, -1, -1), pv.to(dt).expand(B, -1, -1, -1))
    with torch.inference_mode():
        g32, l32, _ = h32(toks, hidden, pos, past_kv=past(torch.float32))
        g16, l16, kv16 = h16(toks, hidden, pos, past_kv=past(torch.bfloat16))
        gb, lb, _ = h16(toks, hidden, pos, past_kv=KVBuffer(past(torch.bfloat16), B, W))
    assert g16.dtype == l16.dtype == kv16[0].dtype == torch.bfloat16
    assert torch.isfinite(l16.float()).all() and torch.isfinite(g16.float()).all()
    for lo, hi in ((g16, g32), (l16, l32)):
        assert (lo.float() - hi).norm() <= 0.05 * hi.norm(), (lo.float() - hi).norm() / hi.norm()
    ulp = torch.finfo(torch.bfloat16).eps
    torch.testing.assert_close(gb, g16, rtol=0, atol=2 * ulp * g16.abs().max().item())
    torch.testing.assert_close(lb, l16, rtol=0, atol=2 * ulp * l16.abs().max().item())

    qs = torch.randn(B, 6, W, 8, generator=g).to(device, torch.bfloat16)
    ks, vs = (torch.randn(B, 2, S + W, 8, generator=g).to(device, torch.bfloat16) for _ in range(2))
    mask = causal_mask(W, S, device, torch.bfloat16)
    ref = F.scaled_dot_product_attention(qs, ks.repeat_interleave(3, 1), vs.repeat_interleave(3, 1), attn_mask=mask)
    torch.testing.assert_close(gqa_attention(qs, ks, vs, mask), ref, rtol=0, atol=8 * ulp * ref.abs().max().item())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_batched_engine_graphs_equal_eager(device, dtype):
    """Replayed graphs run the captured kernels in the captured order, so with the same span buckets
    the output is the eager engine's bit for bit, in bf16 too; in fp32 it is also batch-1 AR's.
    Rows of mixed lengths, refills (7 prompts, 3 rows), a small vocabulary so drafts are accepted."""
    model = tiny(device, dtype, seed=4, vocab=8)
    head = random_head(model, seed=4)
    ps = prompts(7, 8, seed=6)
    graphed = BatchEngine(model, head, span_bucket=32)
    eager = BatchEngine(model, head, cuda_graphs=False, span_bucket=32, pad_rows=graphed.pad_rows)   # same row counts
    for shape in (StepShape(4, 3, 10), StepShape.chain(3), StepShape.off()):
        want = eager.generate(ps, 24, batch_size=3, controller=StaticController(shape))
        for _ in range(2):                                   # the second call replays the first's graphs
            got = graphed.generate(ps, 24, batch_size=3, controller=StaticController(shape))
            assert [r.output_ids for r in got.rows] == [r.output_ids for r in want.rows], shape
            assert [st.accepted for st in got.steps] == [st.accepted for st in want.steps], shape
        if dtype == torch.float32:
            ar = Engine(model, None)
            assert [r.output_ids for r in got.rows] == [ar.generate_ar(p, 24).output_ids for p in ps]
    assert graphed.graphs.failure is None, graphed.graphs.failure
    if device.type == "cuda":
        assert graphed.graphs.captures > 0 and graphed.graphs.replays > graphed.graphs.captures


def test_arrivals_replay_graphs_of_padded_row_counts(device):
    """Requests arriving over time (rows joining and leaving at every step count): every row is its
    batch-1 AR output (fp32), and a second call of the same trace captures no graph at all (the
    stores never moved and the row counts are padded to row_bucket), so it only replays."""
    model = tiny(device, torch.float32, seed=5, vocab=8)
    head = random_head(model, seed=5)
    ps = prompts(12, 8, seed=7)
    eng = BatchEngine(model, head, span_bucket=32)
    arrivals = [0.0, 0.0, 0.01, 0.02, 0.03, 0.05, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4]
    ctl = lambda: StaticController(StepShape(4, 3, 10))
    first = eng.generate(ps, 24, batch_size=6, controller=ctl(), arrivals=arrivals)
    ar = Engine(model, None)
    assert [r.output_ids for r in first.rows] == [ar.generate_ar(p, 24).output_ids for p in ps]
    again = eng.generate(ps, 24, batch_size=6, controller=ctl(), arrivals=[0.0] * len(ps))
    assert [r.output_ids for r in again.rows] == [r.output_ids for r in first.rows]
    if device.type == "cuda":
        closed = eng.generate(ps, 24, batch_size=6, controller=ctl())      # the same row counts as `again`
        assert closed.captures == 0 and eng.graphs.replays > eng.graphs.captures, (first.captures, again.captures)
        assert eng.graphs.failure is None, eng.graphs.failure
