"""Serving at batch B (simulator/serving/): the batched replay is exact (batch 1 = today's replay;
every row at B > 1 = its own batch-1 walk), arrivals, schedules, SGLang's adaptive rule, the
engines' formats and the SGLang timing import. Small synthetic logs; a few seconds in all."""
from __future__ import annotations

import json

import numpy as np
import pytest

from online.cli import main as cli
from pipeline.decode import step_shape
from pipeline.errors import DataError, DraftGymError
from simulator.baselines import StaticPolicy
from simulator.latency.model import LatencyModel
from simulator.logs.replay_logs import load_logs
from simulator.logs.synthetic import SyntheticConfig, write_synthetic_logs
from simulator.replay import autoregressive, simulate
from simulator.serving import arrivals as arr
from simulator.serving import metrics
from simulator.serving.choosers.base import Chooser, StaticChooser
from simulator.serving.choosers.sglang_adaptive import AdaptiveTier, SGLangAdaptive, parse_config
from simulator.serving.inputs import candidates, lookup_verify
from simulator.serving.load import serve
from simulator.serving.replay import ShapeTable, closed_batch
from simulator.serving.schedule import Schedule
from simulator.serving.tune import headroom, tune, tune_part


@pytest.fixture(scope="module")
def w10_root(tmp_path_factory):
    """Logs of width 10 only (no chains), no latency table."""
    d = tmp_path_factory.mktemp("w10-logs")
    write_synthetic_logs(d, SyntheticConfig(n_sequences=2, new_tokens=(8, 12), latency_profile=None))
    return d


# ------------------------------------------------------------------ exactness

@pytest.mark.parametrize("static", [(4, 4, 10), (2, 4, 20), (3, 1, 4), (2, 1, 4), (1, 1, 2)])
def test_batch_one_is_todays_replay(logs, lat, static):
    """B = 1, no queue: the same tau and total time as simulator/replay.py, in both serving paths."""
    ref = simulate(StaticPolicy(*static), logs, lat).summary()
    shape = step_shape.canonical(static)                                   # (2, 1, 4) is chain 2 = (2, 1, 3)
    table = ShapeTable(logs, [step_shape.OFF, shape])
    closed = closed_batch(logs, lat, table, 1, n_requests=logs.n_sequences, shapes=[table.index(shape)])
    res = serve(logs, lat, table, StaticChooser(shape), np.zeros(logs.n_sequences), max_batch=1)
    m = metrics.summarize(res)
    assert closed["tau"][0] == ref["tau"] == m["tau"]
    assert closed["time"][0] == pytest.approx(ref["time_s"], rel=1e-12)
    assert m["busy_s"] == pytest.approx(ref["time_s"], rel=1e-12)
    assert m["tokens"] == ref["tokens"]


def test_batch_one_ar_is_todays_ar(logs, lat):
    ar = autoregressive(logs, lat)
    table = ShapeTable(logs, [step_shape.OFF])
    res = metrics.summarize(serve(logs, lat, table, StaticChooser(step_shape.OFF), np.zeros(logs.n_sequences), 1))
    assert res["tau"] == 1.0 and res["busy_s"] == pytest.approx(float(ar.time.sum()), rel=1e-12)


class RandomChooser(Chooser):
    name = "random"

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)

    def choose(self, view):
        return int(self.rng.integers(len(self.table)))


def walk(logs, seq, shapes):
    """Reference: one sequence alone at batch 1 under a given sequence of shapes -> [(L, emitted)]."""
    p, T, out = 0, int(logs.new_tokens[seq]) - 1, []
    for s in shapes:
        d, w, _ = s
        L = 0 if d == 0 else int(logs.w[w].acceptance[logs.offsets[seq] + p, d - 1,
                                                       logs.grid_index(lookup_verify(logs, s))])
        out.append((L, min(L + 1, T - p)))
        p += L + 1
    assert p >= T
    return out


def test_each_row_at_batch_b_is_its_own_replay(logs, lat):
    """B > 1, a random shape per step under Poisson load: every request's L and tokens per step equal
    its own batch-1 walk under the shapes its steps had."""
    table = ShapeTable(logs, candidates(logs, "all")[:40])
    t = arr.poisson(50.0, 3 * logs.n_sequences, seed=1)
    res = serve(logs, lat, table, RandomChooser(0), t, max_batch=4, trace=True)
    assert res.step_batch.max() > 1
    tr = res.row_trace
    for r in range(len(t)):
        m = tr["request"] == r
        shapes = [table.shapes[a] for a in tr["shape"][m]]
        assert list(zip(tr["accepted"][m].tolist(), tr["emitted"][m].tolist())) == walk(logs, res.seq[r], shapes)
        assert res.tokens[r] == logs.new_tokens[res.seq[r]] - 1 and res.cycles[r] == m.sum()
    assert (res.join >= res.arrival).all() and (res.finish > res.join).all()


def test_closed_batch_agrees_with_the_load_loop(logs, lat):
    """The vectorised closed batch = the event loop with everyone queued at t = 0, over the steps at full B."""
    shapes = [step_shape.OFF, step_shape.chain(2), (3, 4, 10)]
    table = ShapeTable(logs, shapes)
    R = 3 * logs.n_sequences
    closed = closed_batch(logs, lat, table, 3, n_requests=R)
    for a, s in enumerate(shapes):
        res = serve(logs, lat, table, StaticChooser(s), np.zeros(R), max_batch=3)
        full = res.step_batch == 3
        n = int(np.argmin(full)) if not full.all() else len(full)        # the window: steps before the first short one
        assert closed["steps"][a] == n
        assert closed["tokens"][a] == res.step_emitted[:n].sum()
        assert closed["time"][a] == pytest.approx(res.step_time[:n].sum(), rel=1e-12)


@pytest.mark.parametrize("batch", [1, 3, 8, 12])
def test_tabulated_step_time_is_the_latency_model(logs, lat, batch):
    table = ShapeTable(logs, candidates(logs, "all")[:30])
    rng = np.random.default_rng(batch)
    a = rng.integers(len(table), size=50)
    c = rng.uniform(0, 3000, size=50)
    direct = lat.t_step(table.depth[a], table.width[a], table.verify[a], c, batch=batch)
    assert np.allclose(table.step_time(lat, a, batch, c), direct, rtol=1e-12)


def test_shapes_and_what_the_logs_can_replay(logs, w10_root):
    assert step_shape.parse("chain:3") == (3, 1, 4) == step_shape.canonical((3, 1, 40)) and step_shape.parse("off") == step_shape.OFF
    assert step_shape.label((2, 4, 999)) == "tree:2,4,21" and lookup_verify(logs, step_shape.chain(2)) == 4
    with pytest.raises(DraftGymError, match="bad shape"):
        step_shape.parse("chain:x")
    with pytest.raises(DataError, match="not on the logged grid"):
        lookup_verify(logs, (3, 4, 13))
    w10 = load_logs(w10_root, split="all")
    with pytest.raises(DataError, match="width-1 logs"):
        lookup_verify(w10, step_shape.chain(2))
    with pytest.raises(DataError, match="no chain shape"):
        candidates(w10, "chain")




# ------------------------------------------------------------------ arrivals

def test_poisson_rate_and_seed():
    t = arr.poisson(5.0, 20000, seed=3)
    assert (np.diff(t) > 0).all() and np.array_equal(t, arr.poisson(5.0, 20000, seed=3))
    assert 1 / np.diff(t, prepend=0).mean() == pytest.approx(5.0, rel=0.03)
    counts = np.bincount(t.astype(int))[:-1]                      # arrivals per second: Poisson(5)
    assert counts.mean() == pytest.approx(5.0, rel=0.03) and counts.var() == pytest.approx(5.0, rel=0.1)
    s = arr.sweep([1.0, 10.0], 500, seed=0)
    assert len(s) == 1000 and (np.diff(s) >= 0).all()
    assert np.diff(s[:500]).mean() > 5 * np.diff(s[500:]).mean()
    with pytest.raises(DataError, match="positive"):
        arr.poisson(0.0, 3)


def test_trace_files(tmp_path):
    f = tmp_path / "t.txt"
    f.write_text("# arrivals\n0\n0.25\n\n1.5  # late\n1.5\n")
    assert arr.read_trace(f).tolist() == [0.0, 0.25, 1.5, 1.5]
    (tmp_path / "t.json").write_text("[0, 0.125, 3]")
    assert arr.read_trace(tmp_path / "t.json").tolist() == [0.0, 0.125, 3.0]
    for name, text, msg in (("a", "0\nabc\n", "could not convert"), ("b", "1\n0.5\n", "must not decrease"),
                            ("c", "", "no arrival"), ("d", "[1, \"x\"]", "list of numbers"), ("e", "-1\n", ">= 0")):
        (tmp_path / name).write_text(text)
        with pytest.raises(DataError, match=msg) as e:
            arr.read_trace(tmp_path / name)
        assert "\n" not in str(e.value)
    with pytest.raises(DataError, match="not found"):
        arr.read_trace(tmp_path / "missing")


def test_queue_time_and_goodput(logs, lat):
    """Two requests at once and one slot: the second waits for the first; goodput counts fast requests only."""
    table = ShapeTable(logs, [step_shape.OFF])
    res = serve(logs, lat, table, StaticChooser(step_shape.OFF), [0.0, 0.0], max_batch=1, request_seq=[0, 1])
    assert res.join[1] == pytest.approx(res.finish[0]) and res.join[0] == 0.0
    m = metrics.summarize(res, tpot_target=1e9)
    assert m["goodput_tokens_per_s"] == pytest.approx(m["tokens_per_s"]) and m["queue_mean_s"] > 0
    assert metrics.summarize(res, tpot_target=0.0)["goodput_tokens_per_s"] == 0.0


# ------------------------------------------------------------------ schedules and tune

def test_schedule_merges_and_round_trips(tmp_path):
    a, b = step_shape.chain(3), (2, 4, 10)
    s = Schedule.from_choices([8, 1, 2, 4], [b, a, a, b], max_batch=16)
    assert s.ranges == [(1, 3, a), (4, 16, b)]
    assert [s.shape_for(x) for x in (1, 3, 4, 100)] == [a, a, b, b]
    back = Schedule.load(s.save(tmp_path / "s.json"))
    assert back.ranges == s.ranges
    with pytest.raises(DataError, match="without gaps"):
        Schedule([(1, 3, a), (5, 8, b)])
    with pytest.raises(DataError, match="the last range is open"):
        Schedule([(1, 3, a), (4, None, b)])
    # the engine's controller reads the same ranges by the same rule (pipeline/decode/step_shape.py batch_ranges)
    from pipeline.decode.controller import ScheduleController
    ctl = ScheduleController(s.ranges)
    assert [ctl.shape_for(x) for x in (1, 3, 4, 100)] == [s.shape_for(x) for x in (1, 3, 4, 100)]
    (tmp_path / "bad.json").write_text('{"format": "other"}')
    with pytest.raises(DataError, match="not a DraftGym schedule"):
        Schedule.load(tmp_path / "bad.json")


def test_tune_picks_the_best_shape_per_batch(logs, lat):
    res = tune(logs, lat, [1, 2, 8], candidates(logs, "all"), refine=False)
    sched = res["schedule"]
    for i, B in enumerate(res["batch_sizes"]):
        assert sched.shape_for(B) == res["shapes"][int(np.argmax(res["tokens_per_s"][i]))]
    assert len(sched.ranges) == len({tuple(x) for x in sched.shapes()}) <= 3
    off = res["shapes"].index(step_shape.OFF)
    assert np.allclose(res["tau"][:, off], 1.0)


def test_tune_on_chunks_pools_their_closed_batches(tmp_path):
    """tune over a log read in chunks (what --ray runs, one task a chunk): one chunk is the in-memory
    answer exactly; several pool their own closed batches, tokens/s = sum tokens / sum time, so the
    pooled figure lies between the chunks' own."""
    from simulator.logs.stream import LogSource

    d = tmp_path / "logs"
    write_synthetic_logs(d, SyntheticConfig(n_sequences=6, widths=(1, 4), new_tokens=(12, 30), latency_profile="gpu",
                                            latency_batches=(1, 2, 4), shard_sequences=2, seed=3))
    logs, lat = load_logs(d, widths="all", split="all"), LatencyModel.from_logs(d)
    shapes, bs = candidates(logs, "all"), [1, 4]
    whole = tune(logs, lat, bs, shapes, refine=False)
    src = LogSource(d, split="all", widths="all", progress=False)
    chunked = lambda size: (lambda b: [tune_part(c, lat, b, shapes) for c in src.chunks(size, scores=False)])
    assert len(chunked(src.n_positions)(bs)) == 1
    assert np.array_equal(tune(logs, lat, bs, shapes, refine=False, measure=chunked(src.n_positions))["tokens_per_s"],
                          whole["tokens_per_s"])
    parts = chunked(max(1, src.n_positions // 3))(bs)
    assert len(parts) >= 3 and sum(p["sequences"] for p in parts) == logs.n_sequences
    pooled = tune(logs, lat, bs, shapes, refine=False, measure=chunked(max(1, src.n_positions // 3)))
    own = np.stack([p["tokens"] / p["time"] for p in parts])                                # [chunks, n, A]
    assert np.all(own.min(0) - 1e-9 <= pooled["tokens_per_s"]) and np.all(pooled["tokens_per_s"] <= own.max(0) + 1e-9)
    assert np.allclose(pooled["tau"][:, shapes.index(step_shape.OFF)], 1.0) and pooled["sequences"] == logs.n_sequences
    assert pooled["schedule"].meta["chunks"] == len(parts)


def test_headroom_is_the_smallest_worst_shortfall():
    # B = 1, 4, 16; shapes off, chain 1, chain 4: chain 4 wins at B = 1 by 2x, off at B = 16 by 1.5x;
    # chain 1 is never more than 1.25x behind (at B = 1: 100 / 80), so it is s*, and no mix of these B
    # lets a schedule beat it by more than 1.25x
    res = {"batch_sizes": [1, 4, 16], "shapes": [step_shape.OFF, step_shape.chain(1), step_shape.chain(4)],
           "tokens_per_s": np.array([[50.0, 80.0, 100.0], [150.0, 160.0, 120.0], [300.0, 280.0, 200.0]])}
    assert headroom(res) == {"shape": "chain:1", "gap": pytest.approx(1.25), "at_batch": 1}
    res["tokens_per_s"][0, 1] = 40.0          # chain 1 now 2.5x behind at B = 1, off 2x there: chain 4 (1.5x at B = 16)
    assert headroom(res) == {"shape": "chain:4", "gap": pytest.approx(1.5), "at_batch": 16}


def test_tune_cli(root, w10_root, tmp_path, capsys):
    out = tmp_path / "sched.json"
    assert cli(["tune", "--logs", str(root), "--split", "all", "--batch-sizes", "1,4", "--shapes", "chain",
                "--out", str(out), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert [r["batch"] for r in rep["per_batch"] if not r["refined"]] == [1, 4] and out.exists() and out.with_suffix(".csv").exists()
    assert all(r["x_ar"] >= 1.0 for r in rep["per_batch"])
    assert rep["headroom"]["gap"] >= 1.0 and rep["headroom"]["at_batch"] in (1, 4)
    assert cli(["tune", "--logs", str(w10_root), "--latency", str(root), "--split", "all", "--shapes", "chain",
                "--out", str(out)]) == 2
    assert "draftgym: error: no chain shape" in capsys.readouterr().err


def test_tune_what_if_prices_the_logs_with_another_models_profile(root, tmp_path, capsys):
    """--latency-model: the logs' acceptance, the step costs of another model's profile in its own dtype
    (SmolLM2's logs on an 8B target's GPU profile). A copy of the logs' own profile,
    renamed to another model in bf16 and 3x slower everywhere, gives 1/3 the tokens/s and the same x AR
    at every B; without the option that profile is not the logs' and is refused in one line."""
    import pyarrow.parquet as pq

    from simulator.logs.synthetic import write_latency

    rows = [r for f in sorted((root / "latency").rglob("*.parquet")) for r in pq.read_table(f).to_pylist()]
    gpu = tmp_path / "gpu"
    write_latency(gpu, [{**r, "model_id": "llama-3.1-8b", "dtype": "bfloat16", "profile_id": "h100-8b",
                         "device": "NVIDIA H100 80GB HBM3 [bfloat16]",
                         **{k: 3 * r[k] for k in ("median", "p10", "p90", "mean")}} for r in rows])
    args = ["tune", "--logs", str(root), "--split", "all", "--batch-sizes", "1,4", "--shapes", "chain", "--json"]
    assert cli(args + ["--out", str(tmp_path / "own.json")]) == 0
    own = json.loads(capsys.readouterr().out)
    assert cli(args + ["--out", str(tmp_path / "x.json"), "--latency", str(gpu)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("draftgym: error:") and "synthetic-llm" in err and "\n" not in err
    assert cli(args + ["--out", str(tmp_path / "x.json"), "--latency", str(gpu), "--latency-model", "llama-3.1-8b"]) == 0
    cap = capsys.readouterr()
    rep = json.loads(cap.out)
    assert rep["what_if"].startswith("what-if: the acceptance of synthetic-llm") and "h100-8b" in rep["what_if"]
    assert "note: what-if" in cap.err
    for a, b in zip(own["per_batch"], rep["per_batch"]):
        assert b["best"] == a["best"] and b["tokens_per_s"] == pytest.approx(a["tokens_per_s"] / 3)
        assert b["x_ar"] == pytest.approx(a["x_ar"]) and b["tau"] == pytest.approx(a["tau"])


# ------------------------------------------------------------------ SGLang's adaptive rule

def test_sglang_adaptive_ema_warmup_and_hysteresis():
    p = parse_config(None)[1]                                         # the stored B >= 1 tier: steps {1, 3, 5, 7}
    tier = AdaptiveTier(3, p)
    assert tier.steps == 3 and tier.ema == 2.0
    for n in range(1, 15):                                            # warm-up (10), then decisions every 5
        assert not tier.update([5, 5, 5])
        assert tier.ema == pytest.approx(5 - 3 * 0.8 ** n)
    assert tier.update([5, 5, 5]) and tier.steps == 7                 # batch 15: ema 4.89 > 2.5, > 4.5, not > 6.5
    # hysteresis: ema 4.4 keeps 7 (drop to 5 needs ema <= 5 - 0.5 - 0.25), without it goes to 5
    for h, expect in ((-0.25, 7), (0.0, 5)):
        t = AdaptiveTier(7, {**p, "down_hysteresis": h, "warmup_batches": 0, "update_interval": 1, "ema_alpha": 1.0})
        t.update([4.4])
        assert t.steps == expect
    zero = AdaptiveTier(0, {**parse_config(None)[8], "warmup_batches": 0, "update_interval": 1})
    zero.update([0, 0])                                               # from 0: probe the next step up, ema untouched
    assert zero.steps == 1 and zero.ema == 0.0
    assert AdaptiveTier(3, parse_config(None)[32]).steps == 1         # initial steps not a candidate: the middle one


def test_sglang_adaptive_routing_and_config_checks():
    ch = SGLangAdaptive()
    ch.tiers = {b: AdaptiveTier(3, p) for b, p in ch.tiers_cfg.items()}
    ch.keys = list(ch.tiers)
    assert [next(k for k, t in ch.tiers.items() if t is ch.tier(b)) for b in (1, 7, 8, 31, 32, 100)] == [1, 1, 8, 8, 32, 64]
    padded = SGLangAdaptive(cuda_graph_bs=[1, 2, 4, 8, 16])
    padded.tiers, padded.keys = ch.tiers, ch.keys
    assert padded.tier(5) is ch.tiers[8]                              # 5 pads to the CUDA-graph batch 8
    for bad, msg in (({"1": {"candidate_steps": []}}, "non-empty"), ({"x": 1}, "integer-string"),
                     ({"strategy": "throughput_aware", "1": {"candidate_steps": [1]}}, "only 'ema'")):
        with pytest.raises(DataError, match=msg):
            parse_config(bad)
    assert parse_config({"ema_alpha": 0.5, "1": {"candidate_steps": [3, 1]}})[1]["ema_alpha"] == 0.5


def test_sglang_adaptive_runs_in_the_load_replay(logs, lat):
    ch = SGLangAdaptive()
    table = ShapeTable(logs, list(dict.fromkeys([step_shape.OFF, *ch.shapes()])))
    res = serve(logs, lat, table, ch, arr.poisson(20.0, 20, seed=0), max_batch=8)
    used = {table.shapes[a] for a in res.step_shape}
    assert used <= set(ch.shapes()) and res.tokens.sum() == (logs.new_tokens - 1)[res.seq].sum()


# ------------------------------------------------------------------ serve-eval


def test_serve_eval_table(root, capsys):
    assert cli(["serve-eval", "--logs", str(root), "--split", "all", "--tune-split", "all", "--batch-sizes", "1,4",
                "--shapes", "chain", "--target-batches", "1,4", "--requests-per-rate", "6", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    names = [r["name"] for r in rep["rows"]]
    assert names[0] == "AR" and names[2] == "schedule (per B)"
    assert "SGLang adaptive" in names and "SGLang throughput-aware" in names
    assert any(n.startswith("vLLM") for n in names) and names[-1].startswith("oracle")
    ar = rep["rows"][0]
    assert ar["x_ar"] == 1.0 and ar["tau"] == 1.0 and ar["drafts_per_step"] == 0.0
    total = ar["tokens"]
    assert all(r["tokens"] == total for r in rep["rows"])              # every method serves the same requests


def test_serve_eval_skips_what_the_logs_cannot_replay(w10_root, root, capsys):
    """Width-10 logs: no chains, so vLLM's example, SGLang's two rules and Nightjar are skipped, and said so."""
    assert cli(["serve-eval", "--logs", str(w10_root), "--latency", str(root), "--split", "all", "--tune-split", "all",
                "--batch-sizes", "1,2", "--shapes", "tree", "--target-batches", "1,2", "--requests-per-rate", "2",
                "--no-oracle", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rep["rows"]][2:] == ["schedule (per B)"]
    assert len(rep["notes"]) == 6 and all("width-1 logs" in n for n in rep["notes"][1:])
    assert any(n.startswith("Nightjar bandit (authors' fork) skipped") for n in rep["notes"])
    assert rep["notes"][-1].startswith("per-request budget, vLLM adaptive verification and SGLang DSpark skipped")
    # the synthetic profile's prefill lengths start at 128 tokens: the shortest prompt is charged as 128
    assert rep["notes"][0].startswith("prefill: of 6 prompts (122-330 tokens), 1 below (charged as 128 tokens)")
