"""The serving figures (simulator/serving/plots.py) read back from the Figure they return, the trace
writer (`serve-eval --write-trace`) against arrivals.sweep and read_trace, and notebooks/04_serving.ipynb
run on its synthetic fallback. Small synthetic logs."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from online.cli import main as cli
from pipeline.decode import step_shape
from pipeline.errors import DataError
from simulator.logs.synthetic import SyntheticConfig, write_synthetic_logs
from simulator.serve_eval import ServeEvalConfig, method_name, rate_sweep, serve_eval
from simulator.serving import arrivals as arr
from simulator.serving import plots
from simulator.serving.inputs import candidates
from simulator.serving.schedule import Schedule
from simulator.serving.tune import tune
from tests.simulator.serving.conftest import logs, lat  # noqa: F401 (pytest fixtures)

ROOT = Path(__file__).resolve().parents[3]
NOTEBOOK = ROOT / "notebooks" / "04_serving.ipynb"
SMALL = dict(n_sequences=5, new_tokens=(10, 24), latency_batches=(1, 2, 4, 8))


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """Logs the figures can use: the notebook's synthetic fallback, smaller."""
    d = tmp_path_factory.mktemp("plots-logs")
    got, reason = plots.serving_logs(d / "missing", d / "syn", **SMALL)
    assert got == str(d / "syn") and reason.startswith("cannot read")
    return d / "syn"


def bench_report(dtype="float32"):
    """What `python -m tools.bench.batch --out FILE` writes, the fields the figures read."""
    by = lambda a, b, fa, fb: {"1": {"tokens_per_s": a, "full_batch_decode_tokens_per_s": fa},
                               "4": {"tokens_per_s": b, "full_batch_decode_tokens_per_s": fb}}
    return {"config": {"batch_sizes": [1, 4], "methods": {"ar": [0, 1, 1], "chain:2": [2, 1, 3], "tree:2,10,10": [2, 10, 10]}},
            "runs": [{"dtype": dtype, "environment": {"cpu_model": "Test CPU", "device": "cpu"},
                      "by_method": {"ar": by(10.0, 30.0, 11.0, 33.0), "chain:2": by(18.0, 36.0, 20.0, None),
                                    "tree:2,10,10": by(16.0, 20.0, 17.0, 21.0)}}]}


# ------------------------------------------------------------------ which logs

def test_serving_logs_says_what_is_missing(tmp_path, root):
    assert plots.why_not(root) is None and plots.serving_logs(root, tmp_path / "unused") == (str(root), None)
    assert not (tmp_path / "unused").exists()
    w10 = tmp_path / "w10"                               # the demo's kind: width 10, a batch-1 profile, no val
    write_synthetic_logs(w10, SyntheticConfig(n_sequences=2, new_tokens=(8, 12), split_cycle=("train", "test")))
    reason = plots.why_not(w10)
    assert "width-1 positions" in reason and "batch 1 only" in reason and "test-split" not in reason
    assert plots.tune_split_of(w10) == "train" and plots.tune_split_of(root) == "val"


# ------------------------------------------------------------------ (a) tokens/s against B

def test_bench_curves_read_the_report():
    (run,) = plots.bench_curves(bench_report())
    assert run["dtype"] == "float32" and run["where"] == "Test CPU" and run["batch_sizes"] == [1, 4]
    assert run["curves"]["chain:2"] == {1: 18.0, 4: 36.0} and run["shapes"]["tree:2,10,10"] == (2, 10, 10)
    (full,) = plots.bench_curves(bench_report(), "full_batch_decode_tokens_per_s")
    assert full["curves"]["ar"] == {1: 11.0, 4: 33.0} and math.isnan(full["curves"]["chain:2"][4])
    with pytest.raises(DataError, match="not a batch-benchmark report"):
        plots.bench_curves({"runs": []})


def test_replay_curves_are_tunes_closed_batch(logs, lat):
    shapes = {"ar": step_shape.OFF, "chain:2": step_shape.chain(2), "tree:3,10,20": (3, 10, 20), "deep": (9, 10, 60)}
    pred, notes = plots.replay_curves(logs, lat, shapes, [1, 4])
    assert set(pred) == {"ar", "chain:2", "tree:3,10,20"}
    assert len(notes) == 1 and notes[0].startswith("deep: not replayed") and "max_depth" in notes[0]
    # the same numbers, another path
    ref = tune(logs, lat, [1, 4], [step_shape.OFF, step_shape.chain(2), (3, 10, 20)], refine=False)
    for a, name in enumerate(["ar", "chain:2", "tree:3,10,20"]):
        assert [pred[name][1], pred[name][4]] == pytest.approx(ref["tokens_per_s"][:, a].tolist(), rel=1e-12)
    assert pred["ar"][4] > pred["ar"][1]                  # AR's rows share the step: more tokens/s at B = 4


def test_plot_batch_curves(logs, lat):
    (run,) = plots.bench_curves(bench_report())
    pred, _ = plots.replay_curves(logs, lat, run["shapes"], run["batch_sizes"])
    fig = plots.plot_batch_curves(run["curves"], pred, title="t")
    ax = fig.axes[0]
    lines = {ln.get_label(): ln for ln in ax.lines}
    assert list(lines) == ["ar", "chain:2", "tree:2,10,10", "ar (replay)", "chain:2 (replay)", "tree:2,10,10 (replay)"]
    assert lines["chain:2"].get_ydata().tolist() == [18.0, 36.0] and lines["chain:2"].get_xdata().tolist() == [1, 4]
    assert lines["ar (replay)"].get_ydata().tolist() == [pred["ar"][1], pred["ar"][4]]
    assert lines["ar (replay)"].get_linestyle() == "--" and lines["ar"].get_linestyle() == "-"
    assert lines["ar"].get_color() == lines["ar (replay)"].get_color() != lines["chain:2"].get_color()
    assert ax.get_xscale() == "log" and ax.get_xlabel() == "batch size B" and ax.get_title() == "t"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "4"]
    only = plots.plot_batch_curves(None, pred).axes[0]
    assert [ln.get_label() for ln in only.lines] == [f"{n} (replay)" for n in pred]
    with pytest.raises(DataError, match="nothing to plot"):
        plots.plot_batch_curves(None, None)


# ------------------------------------------------------------------ (b) the schedule

def test_plot_schedule_bands_and_candidates():
    """A hand-made tuning table: chain 3 best at B = 1, 2; off from B = 4 (to 8)."""
    tuning = {"batch_sizes": [1, 2, 4], "shapes": ["off", "chain:3", "tree:2,10,10"],
              "tokens_per_s": [[10.0, 25.0, 20.0], [19.0, 30.0, 22.0], [35.0, 30.0, 21.0]]}
    sched = Schedule.from_choices([1, 2, 4], [step_shape.chain(3), step_shape.chain(3), step_shape.OFF], max_batch=8, tuning=tuning)
    assert [(lo, hi) for lo, hi, _ in sched.ranges] == [(1, 3), (4, 8)]
    ax = plots.plot_schedule(sched).axes[0]
    bands = [(p.get_x(), p.get_x() + p.get_width()) for p in ax.patches]
    assert bands == [(1, 4), (4, 12)]                     # [lo, hi + 1); the last to the edge, 1.5 x 8
    assert [t.get_text() for t in ax.texts] == ["1-3\nchain:3", "4-8\noff"]
    lines = {ln.get_label(): ln for ln in ax.lines}
    assert set(lines) == {"off", "chain:3", "tree:2,10,10", "best at B"}
    assert lines["tree:2,10,10"].get_color() == "0.6"    # never chosen: grey
    for band, name in zip(ax.patches, ["chain:3", "off"]):        # a band in the colour of its shape's line
        assert tuple(band.get_facecolor()[:3]) == tuple(lines[name].get_color()[:3])
    assert lines["best at B"].get_ydata().tolist() == [25.0, 30.0, 35.0]
    assert lines["off"].get_ydata().tolist() == [10.0, 19.0, 35.0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["off", "chain:3", "best at B"]
    with pytest.raises(DataError, match="no tuning table"):
        plots.plot_schedule(Schedule.static(step_shape.chain(2), 4))


def test_plot_schedule_of_a_tune(logs, lat):
    res = tune(logs, lat, [1, 2, 4, 8], candidates(logs, "all"))
    ax = plots.plot_schedule(res["schedule"]).axes[0]
    labels = [ln.get_label() for ln in ax.lines]
    assert sorted(labels[:-1]) == sorted(res["schedule"].tuning["shapes"]) and labels[-1] == "best at B"
    assert len(ax.patches) == len(res["schedule"].ranges)
    assert np.allclose(ax.lines[-1].get_ydata(), res["tokens_per_s"].max(1))


# ------------------------------------------------------------------ (c) methods against the rate

def test_rate_sweep_is_serve_eval_at_each_rate(root, capsys):
    cfg = ServeEvalConfig(logs=str(root), split="all", tune_split="all", batch_sizes="1,4", shapes="chain",
                          requests_per_rate=6, max_batch=4)
    rates = [0.5, 20.0]
    sweep = rate_sweep(cfg, rates)
    names = list(sweep["methods"])
    assert names[:3] == ["AR", "best static", "schedule (per B)"] and "SGLang adaptive" in names
    assert any(n.startswith("vLLM") for n in names) and names[-1].startswith("oracle")
    for k, r in enumerate(rates):
        assert cli(["serve-eval", "--logs", str(root), "--split", "all", "--tune-split", "all", "--batch-sizes", "1,4",
                    "--shapes", "chain", "--rates", repr(r), "--requests-per-rate", "6", "--max-batch", "4",
                    "--json"]) == 0
        rep = json.loads(capsys.readouterr().out)
        assert sweep["best_static"][k] == rep["best_static"]
        for row in rep["rows"]:
            assert sweep["methods"][method_name(row["name"])]["tokens_per_s"][k] == row["tokens_per_s"]
    ar = sweep["methods"]["AR"]
    assert ar["mean_batch"][1] > ar["mean_batch"][0] and ar["x_ar"] == [1.0, 1.0]
    fig = plots.plot_rate_sweep(sweep)
    left, right = fig.axes
    assert [ln.get_label() for ln in left.lines] == names == [ln.get_label() for ln in right.lines]
    for ln, m in zip(left.lines, sweep["methods"].values()):
        assert ln.get_xdata().tolist() == rates and ln.get_ydata().tolist() == m["tokens_per_s"]
    assert np.allclose(right.lines[0].get_ydata(), 1e3 * np.asarray(ar["tpot_mean_s"]))
    assert "arrival rate" in left.get_xlabel() and right.get_ylabel() == "mean TPOT, ms"


# ------------------------------------------------------------------ the trace writer

def segments(text: str) -> list[tuple[float, list[float]]]:
    """[(rate, times)] from the '# rate R req/s: requests i-j' comments of a written trace."""
    out = []
    for line in text.splitlines():
        m = re.match(r"# rate (\S+) req/s: requests (\d+)-(\d+)$", line)
        if m:
            out.append((float(m.group(1)), []))
        elif line and not line.startswith("#"):
            out[-1][1].append(float(line))
    return out


def test_write_trace_round_trips(root, tmp_path, capsys):
    f = tmp_path / "trace.txt"
    assert cli(["serve-eval", "--logs", str(root), "--split", "all", "--rates", "1.5,3", "--requests-per-rate", "7",
                "--seed", "4", "--write-trace", str(f)]) == 0
    assert "wrote 14 arrival times" in capsys.readouterr().out
    ref = arr.sweep([1.5, 3.0], 7, 4)
    t = arr.read_trace(f)
    assert t.dtype == np.float64 and np.array_equal(t, ref)                  # exact, not approximately
    text = f.read_text()
    assert "rates 1.5,3 req/s, 7 requests per rate, seed 4" in text.splitlines()[1]
    seg = segments(text)
    assert [r for r, _ in seg] == [1.5, 3.0] and [len(x) for _, x in seg] == [7, 7]
    assert seg[1][1] == ref[7:].tolist() and seg[1][1][0] > seg[0][1][-1]    # the second rate goes on in time


def test_write_trace_is_the_load_serve_eval_replays(root, tmp_path, capsys):
    f = tmp_path / "sweep.txt"
    common = ["--logs", str(root), "--split", "all", "--target-batches", "1,2,4", "--requests-per-rate", "5", "--seed", "2"]
    assert cli(["serve-eval", *common, "--write-trace", str(f), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    rep = serve_eval(ServeEvalConfig(logs=str(root), split="all", tune_split="all", batch_sizes="1,4", shapes="chain",
                                     target_batches="1,2,4", requests_per_rate=5, seed=2, oracle=False))
    assert info["rates"] == rep["load"]["rates"] and info["requests"] == 15 and info["trace"] == str(f)
    assert np.array_equal(arr.read_trace(f), arr.sweep(rep["load"]["rates"], 5, 2))
    assert [len(x) for _, x in segments(f.read_text())] == [5, 5, 5]
    assert "--target-batches 1,2,4" in f.read_text()


def test_segment_seconds_spends_equal_time_at_each_rate(root, tmp_path, capsys):
    """--segment-seconds S: round(rate x S) requests per rate (so each segment lasts about S), written
    and replayed alike; the per-rate TPOT rows follow the uneven segments."""
    f = tmp_path / "sweep.txt"
    common = ["--logs", str(root), "--split", "all", "--target-batches", "1,2,4", "--segment-seconds", "4", "--seed", "1"]
    assert cli(["serve-eval", *common, "--write-trace", str(f), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    counts = [max(1, round(r * 4)) for r in info["rates"]]
    assert info["requests_per_rate"] == counts and len(set(counts)) > 1 and info["requests"] == sum(counts)
    assert [len(x) for _, x in segments(f.read_text())] == counts
    assert np.array_equal(arr.read_trace(f), arr.sweep(info["rates"], counts, 1))
    rep = serve_eval(ServeEvalConfig(logs=str(root), split="all", tune_split="all", batch_sizes="1,4", shapes="chain",
                                     target_batches="1,2,4", segment_seconds=4, seed=1, oracle=False))
    assert rep["load"]["requests_per_rate"] == counts and all(len(r["tpot_by_rate_s"]) == 3 for r in rep["rows"])
    with pytest.raises(DataError, match="segment seconds"):
        arr.segment_counts([1.0], seconds=0)


def test_mean_batch_by_segment_and_the_short_segment_note(root):
    """Each segment's mean batch counts the steps that start from its first arrival to the next
    segment's; a sweep whose AR batch stays under half a segment's target B says so in one note."""
    from types import SimpleNamespace

    from simulator.serve_eval import batch_by_segment, short_segments

    res = SimpleNamespace(step_start=np.array([0.0, 0.5, 1.0, 2.0, 2.5, 9.0]), step_batch=np.array([1, 1, 2, 4, 6, 8]))
    assert batch_by_segment(res, [0.0, 0.4, 2.0, 2.2, 2.4], [2, 3]) == [pytest.approx(4 / 3), 6.0]
    assert short_segments([1, 4, 64], [0.3, 2.5, 14.8]) == [
        "the sweep held fewer rows under AR than its target batch sizes (B 64: 14.8 on average): its segments end "
        "before the batch fills; --segment-seconds or more --requests-per-rate hold each load longer"]
    assert short_segments([1, 8], [1.0, 4.0]) == []
    rep = serve_eval(ServeEvalConfig(logs=str(root), split="all", tune_split="all", batch_sizes="1,4", shapes="chain",
                                     target_batches="1,8", requests_per_rate=2, seed=0, oracle=False))
    ar = rep["rows"][0]["mean_batch_by_rate"]
    assert len(ar) == 2 and ar[1] < 4 and any("target batch sizes (B 8: " in n for n in rep["notes"])


def test_write_trace_refuses_a_trace(root, tmp_path, capsys):
    f, g = tmp_path / "in.txt", tmp_path / "out.txt"
    f.write_text("0.5\n1.0\n")
    assert cli(["serve-eval", "--logs", str(root), "--trace", str(f), "--write-trace", str(g)]) == 2
    err = capsys.readouterr().err
    assert "--trace already names a trace file" in err and len(err.strip().splitlines()) == 1 and not g.exists()
    with pytest.raises(DataError, match="segments count"):
        arr.write_trace(g, [0.1, 0.2], segments=[("a", 1)])


# ------------------------------------------------------------------ the notebook

def test_notebook_is_clean():
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in nb.cells if c.cell_type == "code")


def run_notebook(monkeypatch, logs, bench) -> tuple[str, int]:
    """Execute 04 on these logs and this benchmark report -> (its text outputs, its number of figures)."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    monkeypatch.setenv("DRAFTGYM_LOGS", str(logs))
    monkeypatch.setenv("DRAFTGYM_BENCH", str(bench))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbclient.NotebookClient(nb, kernel_name="python3", timeout=120,
                            resources={"metadata": {"path": str(ROOT / "notebooks")}}).execute()
    outs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    text = "".join(o.get("text", "") + o.get("data", {}).get("text/plain", "") for o in outs)
    return text, sum("image/png" in o.get("data", {}) for o in outs)


def test_notebook_runs_on_the_synthetic_fallback(tmp_path, monkeypatch):
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps(bench_report()))
    text, images = run_notebook(monkeypatch, tmp_path / "no-logs", bench)
    assert "using synthetic logs" in text and "cannot read" in text, text
    assert "bench.json (float32): no replay overlay: the logs are synthetic" in text
    assert "schedule: B 1 -> " in text and "best static per rate: " in text
    assert images == 4, text                               # measured, replay, schedule, rate sweep


def test_notebook_overlays_the_replay_on_usable_logs(root, tmp_path, monkeypatch):
    """Logs with chains and a batched profile are used as they are; a report of their dtype gets the
    measured-against-replayed figure; no report: the replay alone, and said so."""
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps(bench_report("float32")))
    text, images = run_notebook(monkeypatch, root, bench)
    assert "using synthetic logs" not in text and f"logs {root}: " in text, text
    assert "no replay overlay" not in text and images == 5, text      # + measured vs replay
    text, images = run_notebook(monkeypatch, root, tmp_path / "none-*.json")
    assert "no batch-benchmark report at" in text and images == 3, text
