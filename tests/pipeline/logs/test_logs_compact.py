"""Schema version 3 (compact candidates): version-2 logs still read, `compact-logs` converts them in place,
and replay, oracle and heuristics give the same figures; the tail's float16 rounding moves the LTD
observations by at most its stated bound."""
from __future__ import annotations

import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import simulator.logs.synthetic as synthetic
from pipeline.logs.candidates import SCORE_FLOOR
from pipeline.logs.compact import CompactLogsConfig, compact_logs, run_compact_logs_command
from pipeline.logs.schema import TABLE_KEY, VERSION_KEY, check_file, table_files
from simulator.evaluate import evaluate
from simulator.logs.replay_logs import load_logs
from simulator.observations.paper import ltd_depth_obs, ltd_size_obs, sort_levels

CFG = synthetic.SyntheticConfig(n_sequences=6, new_tokens=(20, 40), widths=(10,), seed=3)
RAW: dict = {}           # the unsorted float32 candidate scores the version-2 shards hold, per dataset


def _v2_table(run_key, prompt_id, position, context_len, width, root_token, acceptance, beam_scores, candidate_scores,
              entropy, accept_dist=None, **_):
    """The version-2 layout (candidate_scores [Dmax * W * W] float32), as DraftGym wrote it before."""
    n, Dm, G = np.asarray(acceptance).shape
    RAW[prompt_id[0].rsplit("-", 1)[0]] = np.asarray(candidate_scores, np.float32)
    fsl = lambda a, t: pa.FixedSizeListArray.from_arrays(pa.array(np.asarray(a, t).reshape(-1)), int(np.asarray(a)[0].size))
    return pa.table({"schema_version": np.full(n, 2, np.int16), "run_key": [run_key] * n,
                     "prompt_id": [str(p) for p in prompt_id], "position": np.asarray(position, np.int32),
                     "context_len": np.asarray(context_len, np.int32), "width": np.full(n, width, np.int16),
                     "root_token": np.asarray(root_token, np.int32), "acceptance": fsl(acceptance, np.uint8),
                     "beam_scores": fsl(beam_scores, np.float32), "candidate_scores": fsl(candidate_scores, np.float32),
                     "entropy": fsl(entropy, np.float32)})


def _write_v2(table, path, table_name, filesystem=None):
    meta = {VERSION_KEY: b"2", TABLE_KEY: table_name.encode()}
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table.replace_schema_metadata(meta), path, compression="zstd")
    return path


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    v3 = tmp_path_factory.mktemp("v3")
    synthetic.write_synthetic_logs(v3, CFG)
    v2 = tmp_path_factory.mktemp("v2")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(synthetic, "positions_table", _v2_table)
        mp.setattr(synthetic, "write_atomic", _write_v2)
        synthetic.write_synthetic_logs(v2, CFG)
    return v2, v3


def test_both_versions_read_the_same_rows(roots):
    v2, v3 = roots
    assert all(int(check_file(f).schema_arrow.metadata[VERSION_KEY]) == 2 for f in table_files(v2, "positions"))
    a, b = load_logs(v2), load_logs(v3)
    for name in ("position", "context_len", "seq_index", "offsets", "new_tokens"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert np.array_equal(a.acceptance, b.acceptance)                    # replay: exact integers
    assert np.array_equal(a.beam_scores, b.beam_scores, equal_nan=True)  # RADAR, DDD: exact
    assert np.array_equal(a.entropy, b.entropy, equal_nan=True)          # entropy stop, rich obs: exact
    # the candidates as the observations read them: sorted, floored; the tail rounded to float16
    raw = np.concatenate([RAW[d] for d in sorted(CFG.datasets)])        # in load order: partitions sorted
    assert np.array_equal(a.candidate_scores, sort_levels(raw, 10))
    err = a.candidate_scores - b.candidate_scores                       # the tail is rounded down
    assert np.all((err >= 0) & (err <= 2.0 ** -10 * np.abs(a.candidate_scores) + 1e-7))
    assert err[..., :10].max() == 0.0 and err.max() > 0                # beams exact, the tail rounds
    assert (b.candidate_scores[:, 0, 10:] == SCORE_FLOOR).all()
    # the LTD inputs move by at most float16's ulp of a log-prob above the floor: <= 2^-6
    ctx, D = a.context_len, np.full(a.n_positions, 5)
    for obs in (lambda x: ltd_depth_obs(x[:, 4], D, ctx, 10, presorted=True),
                lambda x: ltd_size_obs(x, D, ctx, 10, presorted=True)):
        assert 0 < np.abs(obs(a.candidate_scores) - obs(b.candidate_scores)).max() <= 2.0 ** -6


def test_compact_converts_in_place_and_evaluate_does_not_move(roots, tmp_path):
    v2, v3 = roots
    work = tmp_path / "logs"
    shutil.copytree(v2, work)
    before = evaluate(work, split="all", policies=["ddd", "entropy", "goodput"])
    out = compact_logs(CompactLogsConfig(logs=str(work), progress=False))
    assert out["converted"] == len(CFG.datasets) and not out["bad"]
    assert out["bytes_after"] < 0.6 * out["bytes_before"]
    assert compact_logs(CompactLogsConfig(logs=str(work), progress=False))["already_v3"] == len(CFG.datasets)
    a, b = load_logs(work), load_logs(v3)                                 # = written as version 3
    assert np.array_equal(a.candidate_scores, b.candidate_scores)
    after = evaluate(work, split="all", policies=["ddd", "entropy", "goodput"])
    for name, r in before["results"].items():
        assert after["results"][name] == r, name


def test_a_bad_shard_is_named_and_the_rest_converted(roots, tmp_path, capsys):
    v2, _ = roots
    work = tmp_path / "logs"
    shutil.copytree(v2, work)
    files = table_files(work, "positions")
    files[0].write_bytes(files[0].read_bytes()[:200])                   # truncated
    assert run_compact_logs_command(CompactLogsConfig(logs=str(work), progress=False)) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(files[0]) in err[0]
    assert all(int(check_file(f).schema_arrow.metadata[VERSION_KEY]) == 3 for f in files[1:])
