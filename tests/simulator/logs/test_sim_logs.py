"""Log loading: schemas, indexing, split filtering, and one-line DataErrors for bad files."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.errors import DataError
from pipeline.logs.candidates import SCORE_FLOOR
from pipeline.logs.schema import LATENCY, SEQUENCES, check_file, positions_schema, table_files
from simulator.logs.replay_logs import load_logs
from simulator.logs.synthetic import write_positions
from tests.simulator.conftest import (HAND_DMAX, HAND_GRID, HAND_SEQS, HAND_W, SYN_CFG, hand_acceptance,  # noqa: F401
                                     hand_root, syn, syn_root)


def test_hand_logs_indexing(hand_root):
    logs = load_logs(hand_root)
    assert logs.n_sequences == 2 and logs.width == HAND_W and logs.max_depth == HAND_DMAX
    assert logs.verify_grid.tolist() == list(HAND_GRID)
    for s, pid in enumerate(logs.prompt_id):
        spec = HAND_SEQS[pid]
        rows = logs.rows_of(s)
        assert logs.new_tokens[s] == spec["new_tokens"]
        assert np.array_equal(logs.position[rows], np.arange(spec["new_tokens"] - 1))
        assert np.array_equal(logs.context_len[rows], spec["prompt_len"] + np.arange(spec["new_tokens"] - 1))
        assert np.array_equal(logs.acceptance[rows], hand_acceptance(spec["base"]))
        assert logs.row(s, 3) == rows.start + 3
    assert logs.acceptance.shape == (logs.n_positions, HAND_DMAX, len(HAND_GRID))
    assert logs.candidate_scores.shape == (logs.n_positions, HAND_DMAX, HAND_W * HAND_W)
    assert (logs.candidate_scores[:, 0, HAND_W:] == SCORE_FLOOR).all()      # level 1 has W candidates


def test_split_and_dataset_filter(hand_root):
    assert load_logs(hand_root, split="train").prompt_id.tolist() == ["A"]
    full = load_logs(hand_root)
    sub = full.select("test")
    assert sub.prompt_id.tolist() == ["B"] and sub.offsets.tolist() == [0, 5]
    assert np.array_equal(sub.acceptance, hand_acceptance(HAND_SEQS["B"]["base"]))
    with pytest.raises(DataError, match="split"):
        load_logs(hand_root, split="nope")
    with pytest.raises(DataError, match="dataset"):
        load_logs(hand_root, datasets=["other"])
    with pytest.raises(DataError, match="width"):
        load_logs(hand_root, width=4)


def test_subset_by_indices_keeps_their_order(hand_root):
    """subset with integer indices: those sequences in that order (validate's replay follows the
    device's queue), each with its own rows; a bool mask keeps log order."""
    full = load_logs(hand_root)
    rev = full.subset(np.array([1, 0]))
    assert rev.prompt_id.tolist() == full.prompt_id.tolist()[::-1]
    assert np.array_equal(rev.acceptance[: rev.offsets[1]], full.acceptance[full.offsets[1]:full.offsets[2]])
    assert full.subset(np.array([False, True])).prompt_id.tolist() == full.prompt_id.tolist()[1:]


def test_synthetic_files_follow_schema(syn_root):
    for table, ref in (("sequences", SEQUENCES), ("latency", LATENCY)):
        for f in table_files(syn_root, table):
            assert check_file(f, table).schema_arrow.remove_metadata().equals(ref)
    for f in table_files(syn_root, "positions"):
        W = int(f.stem.rsplit("-w", 1)[1])
        sch = check_file(f, "positions").schema_arrow.remove_metadata()
        assert sch.equals(positions_schema(SYN_CFG.max_depth, W, len(SYN_CFG.verify_grid), with_dist=False))


def test_synthetic_acceptance_structure(syn):
    logs, _ = syn
    for W in logs.widths:
        acc = logs.w[W].acceptance.astype(int)
        assert (np.diff(acc, axis=2) >= 0).all()                     # monotone in V
        assert (np.diff(acc, axis=1) >= 0).all()                     # monotone in D
        assert (acc <= np.arange(1, logs.max_depth + 1)[None, :, None]).all()
        assert (acc[:, :, 0] == 0).all()                             # V = 1: the root only
    # the latent easiness drives both: best depth-1 score correlates with acceptance
    g = logs.grid_index(60)
    r = np.corrcoef(logs.beam_scores[:, 0, 0], logs.acceptance[:, 7, g])[0, 1]
    assert r > 0.3


def test_corrupt_positions_file(hand_root):
    f = next(p for p in table_files(hand_root, "positions") if "hand-A" in p.name)
    f.write_bytes(f.read_bytes()[:100])
    with pytest.raises(DataError, match="corrupt or partial") as e:
        load_logs(hand_root)
    assert "\n" not in str(e.value)


def test_missing_positions_file(hand_root):
    next(p for p in table_files(hand_root, "positions") if "hand-B" in p.name).unlink()
    with pytest.raises(DataError, match="positions rows"):
        load_logs(hand_root)


def test_foreign_and_mismatched_files(hand_root, tmp_path):
    f = next(p for p in table_files(hand_root, "positions") if "hand-A" in p.name)
    pq.write_table(pa.table({"x": [1, 2]}), f)                       # no DraftGym metadata
    with pytest.raises(DataError, match="not a DraftGym log"):
        load_logs(hand_root)
    # a positions file whose list sizes say max_depth = 4 while the sequences say 8
    n = 11
    write_positions(hand_root, "tiny", "hand", 0.0, HAND_W, ["A"] * n, np.arange(n), np.arange(n),
                    np.zeros((n, 4, len(HAND_GRID))), np.zeros((n, 4, HAND_W)), np.zeros((n, 4, HAND_W * HAND_W)),
                    np.zeros((n, 4, HAND_W)), name="hand-A")
    with pytest.raises(DataError, match="list sizes"):
        load_logs(hand_root)
    with pytest.raises(DataError, match="no sequences table"):
        load_logs(tmp_path / "nothing")
