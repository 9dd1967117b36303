"""Logs larger than memory: sharded synthetic writing (parallel, resumable), chunked reads, streamed
evaluate equal to the in-memory path, and the seeded replay window of training."""
from __future__ import annotations

import numpy as np
import pytest

from pipeline.errors import DataError
from pipeline.logs.schema import table_files
from simulator.evaluate import evaluate
from simulator.logs.load import load_logs
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
