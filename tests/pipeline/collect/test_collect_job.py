"""`draftgym collect` as a job: resuming after a failure, on Ray, orphan and bad shards, failed and bad
prompts skipped and listed, outputs to file:// and s3:// URIs, one-line errors for bad inputs."""
from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.collect.prompt import CollectConfig
from pipeline.collect.job import run_collect
from pipeline.errors import DataError
from pipeline.logs.schema import read_table, table_files

GRID = (1, 2, 4, 8, 10, 20, 60)


def _rows(logs, table):
    cols = ["prompt_id", "position", "width"] if table == "positions" else None   # widths differ in list sizes
    return pa.concat_tables([read_table(f, table, columns=cols) for f in table_files(logs, table)])


def test_collect_job_resumes_after_failure(tmp_path, tiny_model_dir):
    cfg = CollectConfig(model=str(tiny_model_dir), head="random", dataset="mt-bench", split=None, n_prompts=4,
                        max_new_tokens=12, max_depth=4, widths=(2, 3), verify_grid=GRID)
    with pytest.raises(RuntimeError, match="injected failure"):
        run_collect(cfg, tmp_path, use_ray=False, progress=False, fail_after=2)
    assert len(table_files(tmp_path, "sequences")) == 2
    s = run_collect(cfg, tmp_path, use_ray=False, progress=False)
    assert s["skipped_done"] == 2 and s["collected"] == 2
    seq, pos = _rows(tmp_path, "sequences"), _rows(tmp_path, "positions")
    assert seq.num_rows == 4
    keys = list(zip(pos["prompt_id"].to_pylist(), pos["position"].to_pylist(), pos["width"].to_pylist()))
    assert len(keys) == len(set(keys))                      # exactly one row per (sequence, position, width)
    expect = sum((T - 1) * 2 for T in seq["new_tokens"].to_pylist())
    assert len(keys) == expect                              # and no gaps
    again = run_collect(cfg, tmp_path, use_ray=False, progress=False)
    assert again["collected"] == 0 and _rows(tmp_path, "positions").num_rows == expect
    cfgj = json.loads(seq["config_json"][0].as_py())
    env = json.loads(seq["env_json"][0].as_py())
    assert cfgj["widths"] == [2, 3] and "torch" in env and "device" in env
    assert (tmp_path / "_runs" / f"{cfg.run_key()}.json").is_file()


def test_collect_job_on_ray_resumes(tmp_path, tiny_model_dir):
    """The same through Ray Data with an actor: the actor killed midway, then a rerun in which one prompt
    fails (recorded, the others committed), a rerun that skips it, and --retry-failed: in the end
    exactly one sequences row per prompt and one positions row per key."""
    cfg = CollectConfig(model=str(tiny_model_dir), head="random", dataset="humaneval", split=None, n_prompts=3,
                        max_new_tokens=8, max_depth=3, widths=(2,), verify_grid=GRID)
    with pytest.raises(Exception, match="injected failure"):
        run_collect(cfg, tmp_path, use_ray=True, progress=False, fail_after=1)
    done = set(_rows(tmp_path, "sequences")["prompt_id"].to_pylist())
    left = sorted({f"humaneval/HumanEval/{i}" for i in range(3)} - done)
    assert done and left
    # the rerun, with one more prompt raising inside its own work: recorded, and the job goes on
    s = run_collect(cfg, tmp_path, use_ray=True, progress=False, fail_prompts=(left[0],))
    assert s["skipped_done"] == len(done) and s["collected"] == len(left) - 1 and len(s["failed"]) == 1
    assert s["failed"][0].startswith(f"{left[0]}: RuntimeError: injected failure on prompt")
    assert s["actors"] == 1 and s["gpus_per_actor"] == 0.0          # sized from the (CPU-only) cluster
    # (a rerun that skips the failed prompt and says so: test_failed_prompt_is_recorded_skipped_then_retried)
    s = run_collect(cfg, tmp_path, use_ray=True, progress=False, retry_failed=True)
    assert s["collected"] == 1 and table_files(tmp_path, "failures") == []
    seq, pos = _rows(tmp_path, "sequences"), _rows(tmp_path, "positions")
    assert sorted(seq["prompt_id"].to_pylist()) == sorted(f"humaneval/HumanEval/{i}" for i in range(3))
    keys = list(zip(pos["prompt_id"].to_pylist(), pos["position"].to_pylist()))
    assert len(keys) == len(set(keys)) == sum(T - 1 for T in seq["new_tokens"].to_pylist())


def test_orphan_positions_are_removed(tmp_path, tiny_model_dir):
    cfg = CollectConfig(model=str(tiny_model_dir), head="random", dataset="mt-bench", split=None, n_prompts=1,
                        max_new_tokens=6, max_depth=2, widths=(2,), verify_grid=GRID)
    run_collect(cfg, tmp_path, use_ray=False, progress=False)
    seq_file = table_files(tmp_path, "sequences")[0]
    seq_file.unlink()                                        # as if the actor died before its commit
    s = run_collect(cfg, tmp_path, use_ray=False, progress=False)
    assert s["collected"] == 1 and len(table_files(tmp_path, "positions")) == 1


def test_bad_shards_give_clear_errors(tmp_path):
    good = tmp_path / "good.parquet"
    from pipeline.logs.schema import LATENCY, write_atomic

    write_atomic(pa.Table.from_pylist([], schema=LATENCY), good, "latency")
    raw = good.read_bytes()
    partial = tmp_path / "partial.parquet"
    partial.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(DataError, match="corrupt or partial Parquet file .*partial.parquet"):
        read_table(partial)
    foreign = tmp_path / "foreign.parquet"
    pq.write_table(pa.table({"x": [1]}), foreign)
    with pytest.raises(DataError, match="foreign.parquet is not a DraftGym log"):
        read_table(foreign)
    old = tmp_path / "old.parquet"
    t = pa.table({"x": [1]}).replace_schema_metadata({b"draftgym.schema_version": b"0", b"draftgym.table": b"latency"})
    pq.write_table(t, old)
    with pytest.raises(DataError,
                       match="old.parquet has schema version 0, this DraftGym reads versions 2, 3 .collect or profile it again."):
        read_table(old)
    with pytest.raises(DataError, match="holds table 'latency', expected 'positions'"):
        read_table(good, "positions")
    with pytest.raises(DataError, match="no such file"):
        read_table(tmp_path / "missing.parquet")


def _cli(argv, capsys) -> tuple[int, str, str]:
    from online.cli import main

    capsys.readouterr()
    rc = main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_failed_prompt_is_recorded_skipped_then_retried(tmp_path, tiny_model_dir, monkeypatch, capsys):
    """A prompt that raises inside its own work (DRAFTGYM_FAIL_PROMPT) is recorded in `failures` and the
    job commits the others; a rerun skips and reports it; --retry-failed collects it and drops the row."""
    logs = str(tmp_path / "logs")
    cmd = ["collect", "--no-ray", "--model", str(tiny_model_dir), "--head", "random", "--dataset", "mt-bench",
           "--n-prompts", "3", "--max-new-tokens", "6", "--max-depth", "2", "--widths", "2", "--out", logs]
    monkeypatch.setenv("DRAFTGYM_FAIL_PROMPT", "mt-bench/93")
    rc, out, _ = _cli(cmd, capsys)
    assert rc == 0 and "collected 2 prompts" in out and "1 failed" in out
    assert "failed mt-bench/93: RuntimeError: injected failure on prompt mt-bench/93" in out
    seq = _rows(logs, "sequences")
    assert sorted(seq["prompt_id"].to_pylist()) == ["mt-bench/101", "mt-bench/81"]
    assert len(table_files(logs, "positions")) == 2                 # nothing of the failed prompt
    rc, out, _ = _cli(["query", "--logs", logs, "--format", "json", "SELECT * FROM failures"], capsys)
    (row,) = json.loads(out)
    assert row["prompt_id"] == "mt-bench/93" and row["dataset"] == "mt-bench" and row["split"] == "test"
    assert row["error"].startswith("RuntimeError: injected failure") and "\n" not in row["error"]
    assert json.loads(row["config_json"])["widths"] == [2] and "torch" in json.loads(row["env_json"])
    assert row["run_key"] == seq["run_key"][0].as_py() and row["time"].endswith("Z")

    monkeypatch.delenv("DRAFTGYM_FAIL_PROMPT")
    rc, out, _ = _cli(cmd + ["--json"], capsys)                      # a rerun does not retry it
    s = json.loads(out)
    assert s["collected"] == 0 and s["skipped_done"] == 2
    assert s["failed_before"] == ["mt-bench/93: RuntimeError: injected failure on prompt mt-bench/93 (DRAFTGYM_FAIL_PROMPT)"]
    rc, out, _ = _cli(cmd, capsys)
    assert "1 prompt(s) failed in an earlier run and were not retried" in out
    assert len(table_files(logs, "failures")) == 1

    rc, out, _ = _cli(cmd + ["--retry-failed", "--json"], capsys)
    s = json.loads(out)
    assert s["collected"] == 1 and s["failed"] == [] and s["failed_before"] == []
    assert table_files(logs, "failures") == []
    rc, out, _ = _cli(["query", "--logs", logs, "--format", "json",
                       "SELECT (SELECT count(*) FROM failures) AS f, (SELECT count(*) FROM sequences) AS s"], capsys)
    assert json.loads(out) == [{"f": 0, "s": 3}]


def test_collect_to_file_uri_and_relative_out(tmp_path, tiny_model_dir, monkeypatch):
    """--out file:///... writes through the pyarrow filesystem; a relative --out is made absolute on the
    driver, so shards land under the driver's cwd even when the Ray workers' cwd is another one."""
    import os

    import ray

    from pipeline.collect.cluster import init_ray
    from pipeline.logs.query import connect

    cfg = CollectConfig(model=str(tiny_model_dir), head="random", dataset="mt-bench", split=None, n_prompts=1,
                        max_new_tokens=6, max_depth=2, widths=(2,), verify_grid=GRID)
    uri = (tmp_path / "uri-logs").as_uri()
    assert uri.startswith("file:///")
    s = run_collect(cfg, uri, use_ray=False, progress=False)
    assert s["collected"] == 1 and s["out"] == uri
    assert len(table_files(tmp_path / "uri-logs", "positions")) == 1
    assert (tmp_path / "uri-logs" / "_runs" / f"{cfg.run_key()}.json").is_file()
    assert connect(uri).sql("SELECT count(*) FROM sequences").fetchall() == [(1,)]      # readers take file:// too
    assert run_collect(cfg, uri, use_ray=False, progress=False)["skipped_done"] == 1    # resume through the URI

    (tmp_path / "ray-cwd").mkdir()
    (tmp_path / "driver").mkdir()
    monkeypatch.chdir(tmp_path / "ray-cwd")
    init_ray()                                  # workers started now (or earlier) do not run in driver/
    monkeypatch.chdir(tmp_path / "driver")
    worker_cwd = ray.get(ray.remote(lambda: __import__("os").getcwd()).remote())   # pickled by value
    assert worker_cwd != str(tmp_path / "driver")
    s = run_collect(cfg, "relout", use_ray=True, progress=False)
    assert s["collected"] == 1 and s["out"] == str(tmp_path / "driver" / "relout")
    assert len(table_files(tmp_path / "driver" / "relout", "sequences")) == 1
    assert len(table_files(tmp_path / "driver" / "relout", "positions")) == 1
    assert not (tmp_path / "ray-cwd" / "relout").exists() and not os.path.exists(os.path.join(worker_cwd, "relout"))


@pytest.fixture
def s3_logs(monkeypatch):
    """An S3-compatible server on loopback (moto's ThreadedMotoServer, from PyPI) with an empty bucket;
    yields (out URI, S3FileSystem). Credentials are dummies, read from the environment as on a real cluster."""
    import socket

    import pyarrow.fs as pafs

    server_mod = pytest.importorskip("moto.server")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for k, v in {"AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x", "AWS_EC2_METADATA_DISABLED": "true"}.items():
        monkeypatch.setenv(k, v)
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        fs = pafs.S3FileSystem(endpoint_override=f"127.0.0.1:{port}", scheme="http", region="us-east-1",
                               allow_bucket_creation=True)
        fs.create_dir("logs-bucket")
        yield f"s3://logs-bucket/run1?endpoint_override=127.0.0.1:{port}&scheme=http&region=us-east-1", fs
    finally:
        server.stop()


def test_collect_to_s3(s3_logs, tmp_path, tiny_model_dir, capsys, monkeypatch):
    """Shards, the manifest, failures, resume, --retry-failed and orphan clean-up all go through S3."""
    import pyarrow.fs as pafs

    from pipeline.logs.query import connect

    uri, fs = s3_logs
    monkeypatch.setenv("DRAFTGYM_CACHE", str(tmp_path / "cache"))
    cfg = CollectConfig(model=str(tiny_model_dir), head="random", dataset="mt-bench", split=None, n_prompts=3,
                        max_new_tokens=6, max_depth=2, widths=(2,), verify_grid=GRID)
    s = run_collect(cfg, uri, use_ray=False, progress=False, fail_prompts=("mt-bench/82",))
    assert s["collected"] == 2 and [f.split(":")[0] for f in s["failed"]] == ["mt-bench/82"]

    def keys(table=""):
        sel = pafs.FileSelector(f"logs-bucket/run1/{table}", recursive=True, allow_not_found=True)
        return sorted(i.path for i in fs.get_file_info(sel) if i.type == pafs.FileType.File)

    assert len(keys("sequences")) == 2 and len(keys("positions")) == 2 and len(keys("failures")) == 1
    assert keys("_runs") == [f"logs-bucket/run1/_runs/{cfg.run_key()}.json"]
    assert not any(k.rsplit("/", 1)[1].startswith(".") for k in keys())      # one put per shard, no temp keys
    again = run_collect(cfg, uri, use_ray=False, progress=False)
    assert again["collected"] == 0 and again["skipped_done"] == 2 and len(again["failed_before"]) == 1

    seq = keys("sequences")[0]                    # as if an actor died before its commit: an orphan
    fs.delete_file(seq)
    s = run_collect(cfg, uri, use_ray=False, progress=False, retry_failed=True)
    assert s["collected"] == 2 and s["failed"] == []
    assert len(keys("sequences")) == 3 and len(keys("positions")) == 3 and keys("failures") == []

    local = tmp_path / "copy"
    pafs.copy_files("logs-bucket/run1", local.as_posix(), source_filesystem=fs,
                    destination_filesystem=pafs.LocalFileSystem())
    assert connect(local).sql("SELECT count(*) FROM positions").fetchall() == [(sum(
        T - 1 for T in _rows(local, "sequences")["new_tokens"].to_pylist()),)]
    # readers take the URI itself: a local mirror, brought up to date on each call
    from pipeline.logs.storage import mirror_dir
    from simulator.logs.replay_logs import load_logs
    want = connect(local).sql("SELECT count(*), sum(context_len) FROM positions").fetchall()
    assert connect(uri).sql("SELECT count(*), sum(context_len) FROM positions").fetchall() == want
    mirror = mirror_dir(uri)
    assert mirror.is_dir() and str(mirror).startswith(str(tmp_path / "cache"))
    assert load_logs(uri, temperature=0.0).n_sequences == 3
    before = {p: p.stat().st_mtime_ns for p in mirror.rglob("*.parquet")}
    fs.delete_file(keys("sequences")[0])           # gone from the store: gone from the mirror too
    connect(uri)
    after = {p: p.stat().st_mtime_ns for p in mirror.rglob("*.parquet")}
    assert len(after) == len(before) - 1 and all(before[p] == t for p, t in after.items())   # nothing re-read
    from online.cli import main
    assert main(["query", "--logs", "s3://logs-bucket/nope?" + uri.split("?", 1)[1], "SELECT 1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("draftgym: error:") and "\n" not in err


def test_bad_prompts_of_a_file_are_skipped_and_listed_the_rest_collected(tmp_path, tiny_model_dir, capsys):
    """One policy for a file's unusable prompts: an empty one and one too long for the target's positions
    are both skipped, listed in the summary and in the failures table (error 'skipped: ...'), and the
    others are collected; a rerun lists them as skipped again (not as failures to retry). Only a file
    with no usable prompt is refused, in one line."""
    def write(name, rows):
        path = tmp_path / name
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return str(path)

    rows = [{"prompt": "Hi there."}, {"prompt": "   "}, {"prompt": "word " * 2100},
            {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": ""}]},
            {"prompt": "Count to three."}]
    logs = str(tmp_path / "logs")
    cmd = ["collect", "--no-ray", "--model", str(tiny_model_dir), "--head", "random", "--max-new-tokens", "6",
           "--max-depth", "2", "--widths", "2", "--no-progress", "--dataset", write("mine.jsonl", rows), "--out", logs]
    rc, out, err = _cli(cmd, capsys)
    assert rc == 0 and err == "" and "collected 2 prompts" in out and "3 skipped, 0 failed" in out
    assert "skipped mine/1: empty prompt" in out and "skipped mine/3: empty prompt" in out
    assert "skipped mine/2: prompt too long" in out and "SELECT prompt_id, error FROM failures" in out
    assert sorted(_rows(logs, "sequences")["prompt_id"].to_pylist()) == ["mine/0", "mine/4"]
    fails = {r["prompt_id"]: r["error"] for r in _rows(logs, "failures").to_pylist()}
    assert sorted(fails) == ["mine/1", "mine/2", "mine/3"] and all(e.startswith("skipped: ") for e in fails.values())
    rc, out, _ = _cli(cmd + ["--json"], capsys)                     # a rerun: skipped again, nothing to retry
    s = json.loads(out)
    assert (s["collected"], s["skipped_done"], s["failed_before"]) == (0, 2, [])
    assert sorted(x.split(":")[0] for x in s["skipped"]) == ["mine/1", "mine/2", "mine/3"]
    for name, bad, msg in [("empty.jsonl", [{"prompt": ""}, {"prompt": " "}], "all 2 are empty"),
                           ("bad.jsonl", [{"prompt": ""}, {"prompt": "word " * 2100}], "all 2 were skipped")]:
        rc, out, err = _cli(cmd[:-4] + ["--dataset", write(name, bad), "--out", logs], capsys)
        assert rc == 2 and err.startswith("draftgym: error: no usable prompt in ") and msg in err
        assert err.count("\n") == 1


def test_bad_out_uri_is_one_line(capsys):
    for out, msg in [("foo://bucket/x", "cannot open --out foo://bucket/x: Unrecognized filesystem type in URI"),
                     ("s3://b/x?bogus=1", "cannot open --out s3://b/x?bogus=1: Unexpected query parameter in S3 URI")]:
        rc, _, err = _cli(["collect", "--head", "random", "--out", out], capsys)
        assert rc == 2 and err.startswith(f"draftgym: error: {msg}") and err.count("\n") == 1


def test_bad_batch_sizes_are_one_line(tmp_path, capsys):
    """--position-batch / --prompt-batch / --max-new-tokens / --n-prompts below 1 fail up front in one
    line, before any model loads or anything is written (a position batch of 0, or 0 new tokens, used
    to fail every prompt inside the job)."""
    for flag in ("--position-batch", "--prompt-batch", "--max-new-tokens", "--n-prompts"):
        rc, _, err = _cli(["collect", "--head", "random", flag, "0", "--out", str(tmp_path / "x")], capsys)
        assert rc == 2 and err == f"draftgym collect: error: argument {flag}: must be >= 1, got 0\n"
    assert not (tmp_path / "x").exists()


def test_evaluate_streams_positions_from_s3(s3_logs, tmp_path, monkeypatch):
    """Streamed evaluate on an s3:// root: the sequences and latency tables are mirrored, the positions
    shards are read from the store chunk by chunk (never mirrored); the report equals the local one."""
    import pyarrow.fs as pafs

    from pipeline.logs.storage import mirror_dir
    from simulator.evaluate import evaluate
    from simulator.logs.synthetic import SyntheticConfig, write_synthetic_logs

    uri, fs = s3_logs
    uri = uri.replace("/run1?", "/synthetic?")      # moto's store outlives a server: a prefix of its own
    monkeypatch.setenv("DRAFTGYM_CACHE", str(tmp_path / "cache"))
    local = tmp_path / "logs"
    write_synthetic_logs(local, SyntheticConfig(n_sequences=6, new_tokens=(20, 30), seed=2, shard_sequences=3))
    pafs.copy_files(local.as_posix(), "logs-bucket/synthetic", source_filesystem=pafs.LocalFileSystem(),
                    destination_filesystem=fs)
    remote = evaluate(uri, policies=["ddd"], max_positions_in_memory=100)
    assert remote["streamed"] and remote["results"] == evaluate(local, policies=["ddd"])["results"]
    mirrored = {p.relative_to(mirror_dir(uri)).parts[0] for p in mirror_dir(uri).rglob("*.parquet")}
    assert mirrored == {"sequences", "latency"}
