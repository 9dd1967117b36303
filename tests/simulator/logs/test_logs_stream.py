"""Logs larger than memory: sharded synthetic writing (parallel, resumable), chunked reads, streamed
evaluate equal to the in-memory path, and the seeded replay window of training."""
from __future__ import annotations

import numpy as np
import pytest

from pipeline.errors import DataError
from pipeline.logs.schema import table_files
from simulator.evaluate import evaluate
from simulator.logs.replay_logs import load_logs
from simulator.logs.stream import LogSource
from simulator.logs.synthetic import SyntheticConfig, write_synthetic_logs
from simulator.train.common import load_training_data

CFG = SyntheticConfig(n_sequences=15, new_tokens=(20, 40), widths=(8, 10), seed=5, shard_sequences=4)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    r = tmp_path_factory.mktemp("sharded")
    write_synthetic_logs(r, CFG, workers=2)
    return r


def test_sharded_writing_is_deterministic_and_resumes(root, tmp_path):
    assert len(table_files(root, "sequences")) == 3 * 4               # 15 sequences, 4 a shard, 3 datasets
    write_synthetic_logs(tmp_path, CFG, workers=1)
    victim = sorted(table_files(tmp_path, "sequences"))[2]
    victim.unlink()                                                  # an interrupted run: the commit missing
    untouched = {f: f.stat().st_mtime_ns for f in table_files(tmp_path, "positions")}
    out = write_synthetic_logs(tmp_path, CFG, workers=1)
    redone = [f for f, t in untouched.items() if f.stat().st_mtime_ns != t]
    assert len(redone) == 2 and out["positions"] < load_logs(root).n_positions   # only that shard's two widths
    a, b = load_logs(root, widths="all"), load_logs(tmp_path, widths="all")
    assert np.array_equal(a.prompt_id, b.prompt_id)
    for W in (8, 10):
        assert np.array_equal(a.w[W].acceptance, b.w[W].acceptance)
        assert np.array_equal(a.w[W].candidate_scores, b.w[W].candidate_scores)


def test_chunks_cover_every_sequence_once(root):
    src = LogSource(root, widths="all", progress=False)
    whole = load_logs(root, widths="all")
    chunks = list(src.chunks(max_positions=200))
    assert len(chunks) > 3 and all(c.n_positions <= max(200, 4 * 39) for c in chunks)
    idx = np.concatenate([c.source_index for c in chunks])
    assert sorted(idx.tolist()) == list(range(whole.n_sequences))
    for c in chunks:
        ref = whole.subset(c.source_index)
        assert np.array_equal(c.prompt_id, ref.prompt_id)
        for W in (8, 10):
            assert np.array_equal(c.w[W].acceptance, ref.w[W].acceptance)
            assert np.array_equal(c.w[W].beam_scores, ref.w[W].beam_scores, equal_nan=True)


def test_streamed_evaluate_equals_in_memory(root):
    kw = dict(split="test", policies=["ddd", "entropy", "oracle:depth", "static:6,8,40"])
    mem = evaluate(root, **kw)
    streamed = evaluate(root, max_positions_in_memory=150, **kw)
    assert streamed["streamed"] and not mem["streamed"]
    assert streamed["grid_best"] == mem["grid_best"]
    assert streamed["results"] == mem["results"]
    assert streamed["latency_coverage"] == mem["latency_coverage"]


def test_replay_window_is_seeded_and_keeps_the_mix(root):
    full = load_training_data(root)
    ref = load_logs(root).select("train")                                 # fits: everything, in the same order
    assert np.array_equal(full.train.prompt_id, ref.prompt_id) and np.array_equal(full.train.acceptance, ref.acceptance)
    budget = full.train.n_positions // 2
    a = load_training_data(root, max_positions_in_memory=budget, seed=1)
    b = load_training_data(root, max_positions_in_memory=budget, seed=1)
    c = load_training_data(root, max_positions_in_memory=budget, seed=2)
    assert np.array_equal(a.train.prompt_id, b.train.prompt_id)
    assert not np.array_equal(a.train.prompt_id, c.train.prompt_id)
    assert set(a.train.split.tolist()) == {"train"} and set(a.val.split.tolist()) == {"val"}
    assert a.train.n_positions + a.val.n_positions <= budget + 4 * 39
    assert sorted(set(a.train.dataset.tolist())) == sorted(CFG.datasets)   # every dataset kept
    assert any("replay window" in n for n in a.notes)
    first, val = a.train.prompt_id.copy(), a.val.prompt_id.copy()
    assert a.window(0) is a.train and full.window(3) is full.train         # phase 0, and logs that fit: no refill
    w1 = a.window(1)                                                      # LTD's next phase: a new draw
    assert w1 is a.train and set(w1.split.tolist()) == {"train"} and not np.array_equal(w1.prompt_id, first)
    assert np.array_equal(b.window(1).prompt_id, w1.prompt_id) and np.array_equal(a.val.prompt_id, val)


def test_a_truncated_shard_is_one_line(root, tmp_path):
    import shutil

    work = tmp_path / "logs"
    shutil.copytree(root, work)
    f = sorted(table_files(work, "positions"))[5]
    f.write_bytes(f.read_bytes()[:300])
    with pytest.raises(DataError) as e:
        evaluate(work, max_positions_in_memory=150)
    assert str(f) in str(e.value) and "\n" not in str(e.value)


def test_validate_reads_a_window_with_its_prompts_and_streams_grid_best(root, tmp_path, monkeypatch):
    """validate on logs larger than --max-positions-in-memory: a window plus the decoded prompts' sequences
    (found by collection's shard names, else from the shards' prompt_id column), and grid-best streamed
    over every chunk: the same grid-best as reading the logs whole."""
    import simulator.logs.stream as stream
    from online.validate.common import ValidateConfig, load_acceptance_logs
    from online.validate.batch1 import simulator_side
    from pipeline.logs.schema import prompt_hash

    whole = load_logs(root, widths="all")
    want = [p for p, s in zip(whole.prompt_id.tolist(), whole.split.tolist()) if s == "test"][-2:]
    cfg = ValidateConfig(model=whole.model, logs=str(root), datasets=("mt-bench",), progress=False)
    mem, _, src = load_acceptance_logs(cfg, "float32", want)
    assert src is None and np.array_equal(mem.prompt_id, whole.prompt_id)            # fits: read whole
    small = ValidateConfig(model=whole.model, logs=str(root), datasets=("mt-bench",), progress=False,
                           max_positions_in_memory=150)
    win, _, src = load_acceptance_logs(small, "float32", want)
    assert src is not None and win.n_positions < whole.n_positions and set(want) <= set(win.prompt_id.tolist())
    for p in want:                                                 # the prompts' rows, as read whole
        a, b = whole.subset(whole.prompt_id == p), win.subset(win.prompt_id == p)
        assert np.array_equal(a.w[10].acceptance, b.w[10].acceptance)
    sims = [simulator_side(c, logs, s, None, None, None, None, "float32", {}, False)[0]
            for c, logs, s in ((cfg, mem, None), (small, win, src))]
    assert sims[0].grid == sims[1].grid

    # collection's layout (<run_key>-<prompt_hash>-w<W>, a group per prompt): found by name, no shard opened
    named = tmp_path / "named"
    write_synthetic_logs(named, SyntheticConfig(n_sequences=2, new_tokens=(5, 8), widths=(10,), seed=1, shard_sequences=1))
    for f in table_files(named, "positions"):
        (pid,) = set(stream.read_table(f, "positions", ["prompt_id"]).column(0).to_pylist())
        f.rename(f.with_name(f"synthetic-{prompt_hash(pid)}-w10.parquet"))
    src = LogSource(named, progress=False)
    pid = src.sel.sequences.prompt_id[3]
    monkeypatch.setattr(stream, "read_table", lambda *a, **k: pytest.fail("a shard was opened"))
    assert [src.groups[i].name for i in src.groups_of([pid])] == [f"synthetic-{prompt_hash(pid)}"]


def test_radar_and_resps_train_on_a_new_window_per_part(root):
    """RADAR and Re-SpS on logs larger than the window: the run in WINDOWS parts, part k on window k
    (episodes start at the refill: RADAR's every step resets; PPO's open episodes end, bootstrapped)."""
    from dataclasses import replace

    from simulator.train.common import WINDOWS, window_starts
    from simulator.methods.radar.train import RadarConfig, train_radar
    from simulator.methods.resps.train import RespsConfig, train_resps

    assert window_starts(16) == {2: 1, 4: 2, 6: 3, 8: 4, 10: 5, 12: 6, 14: 7} and window_starts(3) == {1: 1, 2: 2}
    data = load_training_data(root, widths=[10], max_positions_in_memory=300, seed=3)
    drawn, draw = [], data.refill
    data.refill = lambda k: drawn.append(k) or draw(k)
    first = data.train.prompt_id.copy()
    r = train_radar(data, RadarConfig(steps=16, batch=8, eval_every=8), progress=False)
    assert drawn == list(range(1, WINDOWS)) and not np.array_equal(data.train.prompt_id, first) and r["net"] is not None
    drawn.clear()
    cfg = RespsConfig(steps=16 * 64, ppo=replace(RespsConfig().ppo, n_envs=8, n_steps=8, minibatch=32, epochs=1))
    r = train_resps(data, cfg, progress=False)                       # 16 updates of 64 decisions
    assert drawn == list(range(1, WINDOWS)) and len(r["history"]) == 16
