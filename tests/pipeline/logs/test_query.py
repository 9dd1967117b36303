"""`pipeline.logs.query`: DuckDB views, example queries, Polars scans and the `draftgym query` CLI, on tiny
hand-built logs whose expected aggregates are computed by hand below (no model is loaded)."""
from __future__ import annotations

import csv
import io
import json
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.errors import DataError, DraftGymError
from pipeline.logs.query import acceptance_array, connect, run_sql, scan
from pipeline.logs.query_examples import EXAMPLES
from pipeline.logs.schema import (CYCLES, LATENCY, SCHEMA_VERSION, SEQUENCES, TABLE_KEY, VERSION_KEY, partition_dir,
                             positions_schema, tail_array, write_atomic)

ROOT = Path(__file__).resolve().parents[3]
MODEL, DATASET = "tiny/model", "toy"       # the partition folder is model=tiny--model
MAX_DEPTH, GRID = 3, (1, 4, 60)
CAP = {1: 0, 4: 2, 60: 99}                 # the tree (D, V) accepts min(D, m_p, CAP[V]) tokens
NEW_TOKENS = 5                             # positions 0..3 (p < new_tokens - 1)
# m_p: how deep the logged continuation matches the drafted tree at root p
M = {("rk1", "toy/A", 2): [3, 0, 1, 2],
     ("rk1", "toy/B", 2): [1, 1, 3, 0],
     ("rk1", "toy/A", 3): [3, 3, 3, 3],
     ("rk1", "toy/C", 2): [3, 3, 3, 3],    # orphan: no sequences row (a killed actor)
     ("rk2", "toy/A", 2): [0, 0, 0, 0]}    # temperature 0.7, with accept_dist
TEMP = {"rk1": 0.0, "rk2": 0.7}


def acceptance(m: list[int]) -> np.ndarray:
    """[positions, MAX_DEPTH, len(GRID)]: L[p, D-1, i] = min(D, m_p, CAP[GRID[i]])."""
    return np.array([[[min(D, mp, CAP[v]) for v in GRID] for D in range(1, MAX_DEPTH + 1)] for mp in m], np.uint8)


def _fixed(flat: np.ndarray, typ: pa.DataType) -> pa.Array:
    return pa.FixedSizeListArray.from_arrays(pa.array(flat.reshape(-1), type=typ.value_type), typ.list_size)


def write_positions(root: Path, run_key: str, pid: str, W: int, with_dist: bool = False) -> Path:
    m = M[(run_key, pid, W)]
    n = len(m)
    schema = positions_schema(MAX_DEPTH, W, len(GRID), with_dist)
    cols = {"schema_version": pa.array(np.full(n, SCHEMA_VERSION, np.int16)), "run_key": pa.array([run_key] * n),
            "prompt_id": pa.array([pid] * n), "position": pa.array(np.arange(n, dtype=np.int32)),
            "context_len": pa.array(np.arange(n, dtype=np.int32) + 10), "width": pa.array(np.full(n, W, np.int16)),
            "root_token": pa.array(np.arange(n, dtype=np.int32)),
            "acceptance": _fixed(acceptance(m), schema.field("acceptance").type)}
    for name in ("beam_scores", "entropy") + (("accept_dist",) if with_dist else ()):
        typ = schema.field(name).type
        cols[name] = _fixed(np.full(n * typ.list_size, -1.0, np.float32), typ)
    cols["candidate_tail"] = tail_array(np.full((n, MAX_DEPTH * (W * W - W)), -1.0, np.float16))
    d = partition_dir(root, "positions", MODEL, DATASET, TEMP[run_key])
    return write_atomic(pa.Table.from_pydict(cols, schema=schema), d / f"{run_key}-{pid[-1]}-w{W}.parquet",
                        "positions")


def write_sequence(root: Path, run_key: str, pid: str, widths: list[int]) -> Path:
    row = {"schema_version": SCHEMA_VERSION, "run_key": run_key, "prompt_id": pid, "split": "test",
           "model_id": MODEL, "head_id": "h", "dtype": "float32", "seed": 0, "prompt_tokens": [1, 2], "output_tokens": list(range(8)),
           "new_tokens": NEW_TOKENS, "stop_reason": "max_new_tokens", "widths": widths, "max_depth": MAX_DEPTH,
           "verify_grid": list(GRID), "config_json": "{}", "env_json": "{}", "collect_s": 1.0}
    d = partition_dir(root, "sequences", MODEL, DATASET, TEMP[run_key])
    return write_atomic(pa.Table.from_pylist([row], schema=SEQUENCES), d / f"{run_key}-{pid[-1]}.parquet", "sequences")


def write_latency(root: Path) -> None:
    """Two profiles, laid out as pipeline/profiling/profile.py does (<logs>/latency/model=<m>/<profile>.parquet)."""
    base = {"schema_version": SCHEMA_VERSION, "device": "cpu-test", "device_type": "cpu", "model_id": MODEL,
            "head_id": "h", "dtype": "float32", "context_len": 16, "batch": 1, "n": 10, "env_json": "{}"}
    for prof, verify_med in (("p1", 0.020), ("p2", 0.040)):
        rows = [dict(base, profile_id=prof, op="draft_step", width=2, verify_size=0, median=0.010, p10=0.009,
                     p90=0.012, mean=0.010),
                dict(base, profile_id=prof, op="verify", width=0, verify_size=4, median=verify_med,
                     p10=verify_med - 0.005, p90=verify_med + 0.005, mean=verify_med)]
        d = partition_dir(root, "latency", MODEL, "_", 0).parent.parent
        write_atomic(pa.Table.from_pylist(rows, schema=LATENCY), d / f"{prof}.parquet", "latency")


def write_cycles(root: Path) -> None:
    rows = []
    for method, emitted in (("static", [2, 3, 1]), ("ar", [1, 1])):
        for c, e in enumerate(emitted):
            rows.append({"schema_version": SCHEMA_VERSION, "run_id": "o1", "method": method, "prompt_id": "toy/A",
                         "run": 0, "cycle": c, "position": c, "context_len": 10 + c, "depth": 3, "width": 2,
                         "verify_size": 4, "accepted": e - 1, "emitted": e, "t_draft": 0.01, "t_verify": 0.02,
                         "t_controller": 0.0, "t_cycle": 0.04, "device": "cpu"})
    d = partition_dir(root, "cycles", MODEL, DATASET, 0.0)
    write_atomic(pa.Table.from_pylist(rows, schema=CYCLES), d / "o1.parquet", "cycles")


def make_logs(root: Path, latency: bool = True, cycles: bool = True) -> Path:
    write_positions(root, "rk1", "toy/A", 2)
    write_positions(root, "rk1", "toy/A", 3)
    write_positions(root, "rk1", "toy/B", 2)
    write_positions(root, "rk1", "toy/C", 2)          # orphan
    write_positions(root, "rk2", "toy/A", 2, with_dist=True)
    write_sequence(root, "rk1", "toy/A", [2, 3])
    write_sequence(root, "rk1", "toy/B", [2])
    write_sequence(root, "rk2", "toy/A", [2])
    if latency:
        write_latency(root)
    if cycles:
        write_cycles(root)
    return root


@pytest.fixture(scope="module")
def logs(tmp_path_factory) -> Path:
    return make_logs(tmp_path_factory.mktemp("logs"))


@pytest.fixture(scope="module")
def con(logs):
    c = connect(logs)
    yield c
    c.close()


def rows(con, sql: str) -> list[dict]:
    cols, rs = run_sql(con, sql)
    return [dict(zip(cols, r)) for r in rs]


def ex(con, name: str, where: str = "true") -> list[dict]:
    return rows(con, f"SELECT * FROM ({EXAMPLES[name]}) WHERE {where}")


# ---------------------------------------------------------------------------------------------- views

def test_views_partitions_and_committed_rows(con):
    assert rows(con, "SELECT count(*) AS n FROM sequences")[0]["n"] == 3
    # orphan toy/C (4 rows) excluded; 4 + 4 (W=2) + 4 (W=3) at T=0, 4 at T=0.7
    assert rows(con, "SELECT count(*) AS n FROM positions")[0]["n"] == 16
    assert rows(con, "SELECT count(*) AS n FROM positions_raw")[0]["n"] == 20
    assert rows(con, "SELECT count(*) AS n FROM positions WHERE prompt_id = 'toy/C'")[0]["n"] == 0
    r = rows(con, "SELECT DISTINCT model, dataset, temperature, typeof(temperature) AS t FROM positions ORDER BY 3")
    assert [(x["model"], x["dataset"], x["temperature"], x["t"]) for x in r] == [
        ("tiny--model", "toy", 0.0, "DOUBLE"), ("tiny--model", "toy", 0.7, "DOUBLE")]
    # accept_dist exists in the T > 0 shard only (union by name)
    r = rows(con, "SELECT temperature, count(accept_dist) AS n FROM positions GROUP BY 1 ORDER BY 1")
    assert [(x["temperature"], x["n"]) for x in r] == [(0.0, 0), (0.7, 4)]
    # latency is partitioned by model only: dataset/temperature are NULL columns
    r = rows(con, "SELECT DISTINCT model, dataset, temperature FROM latency")
    assert r == [{"model": "tiny--model", "dataset": None, "temperature": None}]
    s = ex(con, "summary", "temperature = 0")
    assert s[0]["sequences"] == 2 and s[0]["position_rows"] == 12 and s[0]["orphan_rows"] == 4


def test_acceptance_long_matches_the_arrays(con):
    r = rows(con, "SELECT * FROM acceptance_long ORDER BY run_key, prompt_id, width, position, depth, verify_size")
    assert len(r) == 16 * MAX_DEPTH * len(GRID)
    assert list(r[0]) == ["run_key", "prompt_id", "model", "dataset", "temperature", "width", "position",
                          "context_len", "depth", "verify_size", "accepted"]
    for x in r:
        mp = M[(x["run_key"], x["prompt_id"], x["width"])][x["position"]]
        assert x["accepted"] == min(x["depth"], mp, CAP[x["verify_size"]])
        assert x["context_len"] == x["position"] + 10
    m = rows(con, "SELECT accepted_at(acceptance, verify_grid, 2, 60) AS a, accepted_at(acceptance, verify_grid, 2, 5)"
                  " AS b FROM positions JOIN sequences USING (run_key, prompt_id)"
                  " WHERE prompt_id = 'toy/A' AND run_key = 'rk1' AND width = 2 ORDER BY position")
    assert [x["a"] for x in m] == [2, 0, 1, 2] and all(x["b"] is None for x in m)


def test_empty_view_for_a_missing_table(tmp_path):
    make_logs(tmp_path, latency=False, cycles=False)
    c = connect(tmp_path)
    try:
        assert rows(c, "SELECT count(*) AS n FROM latency")[0]["n"] == 0
        assert rows(c, "SELECT count(*) AS n FROM cycles")[0]["n"] == 0
        cols = run_sql(c, "SELECT * FROM latency")[0]
        assert {"op", "width", "verify_size", "median", "p10", "p90", "model", "temperature"} <= set(cols)
        assert ex(c, "latency_curves") == []
    finally:
        c.close()


# ---------------------------------------------------------------------------------------------- examples

def test_tau_by_depth_size(con):
    r = {(x["width"], x["depth"], x["verify_size"]): x for x in ex(con, "tau_by_depth_size", "temperature = 0")}
    assert len(r) == 2 * MAX_DEPTH * len(GRID)
    # W=2, V=60, L = min(D, m): A m=[3,0,1,2], B m=[1,1,3,0]
    assert r[2, 1, 60]["tau_per_root"] == pytest.approx(1 + 6 / 8)    # L: 1,0,1,1 | 1,1,1,0
    assert r[2, 2, 60]["tau_per_root"] == pytest.approx(1 + 9 / 8)    # L: 2,0,1,2 | 1,1,2,0
    assert r[2, 3, 60]["tau_per_root"] == pytest.approx(1 + 11 / 8)   # L: 3,0,1,2 | 1,1,3,0
    assert r[2, 3, 4]["tau_per_root"] == pytest.approx(1 + 9 / 8)     # capped at 2
    assert r[2, 3, 1]["tau_per_root"] == pytest.approx(1.0)
    assert r[2, 3, 60]["n_roots"] == 8 and r[2, 3, 60]["mean_accepted"] == pytest.approx(11 / 8)
    assert r[3, 3, 60]["tau_per_root"] == pytest.approx(4.0) and r[3, 3, 60]["n_roots"] == 4
    t7 = ex(con, "tau_by_depth_size", "temperature = 0.7")
    assert len(t7) == MAX_DEPTH * len(GRID) and all(x["tau_per_root"] == 1.0 for x in t7)


def test_per_position_acceptance(con):
    r = ex(con, "per_position_acceptance", "temperature = 0 AND width = 2 AND depth = 3 AND verify_size = 60")
    # L at D=3, V=60: 3,0,1,2,1,1,3,0 -> L>=1: 6/8, L>=2: 3/8, L>=3: 2/8 (the rates sum to mean L 11/8)
    assert [x["draft_position"] for x in r] == [1, 2, 3]
    assert [x["acceptance_rate"] for x in r] == pytest.approx([0.75, 0.375, 0.25])
    allr = ex(con, "per_position_acceptance", "width = 2 AND temperature = 0")
    assert len(allr) == (1 + 2 + 3) * len(GRID)                 # i = 1..D for every (D, V)
    tau = {(x["depth"], x["verify_size"]): x["mean_accepted"] for x in ex(con, "tau_by_depth_size", "width = 2 AND temperature = 0")}
    for (D, V), mean_l in tau.items():
        assert sum(x["acceptance_rate"] for x in allr if (x["depth"], x["verify_size"]) == (D, V)) == pytest.approx(mean_l)


def test_accept_hist_by_depth(con):
    r = ex(con, "accept_hist_by_depth", "temperature = 0 AND width = 2 AND depth = 3")
    assert {x["accepted"]: x["n_roots"] for x in r} == {0: 2, 1: 3, 2: 1, 3: 2}
    assert {x["accepted"]: x["fraction"] for x in r} == pytest.approx({0: 0.25, 1: 0.375, 2: 0.125, 3: 0.25})


def _replay(m: list[int], D: int, V: int) -> tuple[int, int]:
    """Reference walk (tests.helpers.replay_static + the engine's capped `emitted`)."""
    p, cycles, emitted = 0, 0, 0
    while p < NEW_TOKENS - 1:
        L = min(D, m[p], CAP[V])
        cycles, emitted, p = cycles + 1, emitted + min(L + 1, NEW_TOKENS - 1 - p), p + L + 1
    return cycles, emitted


def test_tau_replay(con):
    r = {(x["depth"], x["verify_size"]): x for x in ex(con, "tau_replay", "temperature = 0 AND width = 2")}
    # D=3, V=60: A: p=0 L=3 -> p=4 (1 cycle, 4 tokens); B: p=0 L=1 -> p=2 L=3 (emits 2, cut) -> 2 cycles, 4
    assert (r[3, 60]["cycles"], r[3, 60]["emitted"], r[3, 60]["tau"]) == (3, 8, pytest.approx(8 / 3))
    assert r[3, 60]["n_sequences"] == 2
    assert r[1, 1]["tau"] == 1.0 and r[1, 1]["cycles"] == 8
    for (D, V), x in r.items():
        a, b = _replay(M["rk1", "toy/A", 2], D, V), _replay(M["rk1", "toy/B", 2], D, V)
        assert (x["cycles"], x["emitted"]) == (a[0] + b[0], a[1] + b[1])
    # the replayed tau differs from the per-root expectation (2.375) for the same (D, V)
    assert r[3, 60]["tau"] != pytest.approx(1 + 11 / 8)


def test_latency_curves_and_online_tau(con):
    r = {(x["op"], x["width"], x["verify_size"]): x for x in ex(con, "latency_curves")}
    v = r["verify", 0, 4]
    assert v["n_profiles"] == 2 and v["n"] == 20
    assert (v["median_ms"], v["p10_ms"], v["p90_ms"]) == pytest.approx((30.0, 25.0, 35.0))
    assert r["draft_step", 2, 0]["median_ms"] == pytest.approx(10.0)
    o = {x["method"]: x for x in ex(con, "online_tau")}
    assert o["static"]["tau"] == pytest.approx(2.0) and o["static"]["cycles"] == 3
    assert o["ar"]["tau"] == pytest.approx(1.0)
    assert o["static"]["tokens_per_s_in_cycles"] == pytest.approx(6 / 0.12)


# ---------------------------------------------------------------------------------------------- errors

def _one_line(e: BaseException) -> str:
    s = str(e)
    assert "\n" not in s, s
    return s


def test_corrupt_and_partial_shards_name_the_file(tmp_path):
    make_logs(tmp_path)
    bad = partition_dir(tmp_path, "positions", MODEL, DATASET, 0) / "rk1-X-w2.parquet"
    bad.write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(DataError) as e:
        connect(tmp_path)
    assert str(bad) in _one_line(e.value)
    good = partition_dir(tmp_path, "sequences", MODEL, DATASET, 0) / "rk1-A.parquet"
    bad.write_bytes(good.read_bytes()[: good.stat().st_size // 2])      # a partial copy
    with pytest.raises(DataError) as e:
        connect(tmp_path)
    assert str(bad) in _one_line(e.value)


def test_schema_version_mismatch(tmp_path):
    make_logs(tmp_path)
    t = pa.Table.from_pylist([], schema=SEQUENCES).replace_schema_metadata({VERSION_KEY: b"99",
                                                                           TABLE_KEY: b"sequences"})
    f = partition_dir(tmp_path, "sequences", MODEL, DATASET, 0) / "future.parquet"
    pq.write_table(t, f)
    with pytest.raises(DataError, match="schema version 99") as e:
        connect(tmp_path)
    assert str(f) in _one_line(e.value)
    with pytest.raises(DataError, match="schema version 99"):
        scan(tmp_path, "sequences")


def test_missing_dir_and_bad_sql(tmp_path, con):
    with pytest.raises(DraftGymError, match="no logs directory"):
        connect(tmp_path / "nope")
    with pytest.raises(DataError, match="no DraftGym logs"):
        connect(tmp_path)
    with pytest.raises(DraftGymError) as e:
        run_sql(con, "SELEC 1")
    assert _one_line(e.value).startswith("query failed: Parser Error")
    with pytest.raises(DraftGymError) as e:
        run_sql(con, "SELECT nope FROM positions")
    assert "nope" in _one_line(e.value)


# ---------------------------------------------------------------------------------------------- Polars

def test_polars_scan_and_acceptance_array(logs):
    import polars as pl

    pos = scan(logs, "positions")
    schema = pos.collect_schema()
    assert isinstance(schema["acceptance"], pl.Array)          # one size everywhere
    assert isinstance(schema["beam_scores"], pl.List)          # W=2 and W=3 shards disagree
    assert schema["temperature"] == pl.Float64 and {"model", "dataset", "accept_dist"} <= set(schema)
    assert pos.select(pl.len()).collect().item() == 16
    assert scan(logs, "positions", committed=False).select(pl.len()).collect().item() == 20
    seq = scan(logs, "sequences").select("run_key", "prompt_id", "max_depth", "verify_grid")
    df = (pos.filter(pl.col("width") == 2, pl.col("run_key") == "rk1")
          .join(seq, on=["run_key", "prompt_id"]).sort("prompt_id", "position").collect())
    a = acceptance_array(df)
    assert a.shape == (8, MAX_DEPTH, len(GRID)) and a.dtype == np.uint8
    np.testing.assert_array_equal(a, np.concatenate([acceptance(M["rk1", "toy/A", 2]), acceptance(M["rk1", "toy/B", 2])]))
    assert acceptance_array(pos.head(0), max_depth=MAX_DEPTH).shape[0] == 0
    with pytest.raises(DataError):
        acceptance_array(df, max_depth=2)
    lat = scan(logs, "latency").collect()
    assert lat.height == 4 and lat["dataset"].is_null().all()


# ---------------------------------------------------------------------------------------------- CLI

def _cli(argv, capsys) -> tuple[int, str, str]:
    from online.cli import main

    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_formats(logs, capsys):
    rc, out, _ = _cli(["query", "--logs", str(logs), "--example", "accept_hist_by_depth", "--format", "json"], capsys)
    assert rc == 0
    data = [x for x in json.loads(out) if x["temperature"] == 0 and x["width"] == 2 and x["depth"] == 3]
    assert {x["accepted"]: x["n_roots"] for x in data} == {0: 2, 1: 3, 2: 1, 3: 2}
    rc, out, _ = _cli(["query", "SELECT prompt_id, verify_grid, new_tokens FROM sequences ORDER BY run_key, prompt_id",
                       "--logs", str(logs), "--format", "csv"], capsys)
    r = list(csv.DictReader(io.StringIO(out)))
    assert rc == 0 and [x["prompt_id"] for x in r] == ["toy/A", "toy/B", "toy/A"]
    assert json.loads(r[0]["verify_grid"]) == list(GRID) and r[0]["new_tokens"] == "5"
    rc, out, _ = _cli(["query", "SELECT count(*) AS n_rows FROM positions", "--logs", str(logs)], capsys)
    assert rc == 0 and "n_rows" in out and "16" in out
    rc, out, _ = _cli(["query", "--list-examples"], capsys)
    assert rc == 0 and all(name in out for name in EXAMPLES)


def test_cli_errors_are_one_line(logs, tmp_path, capsys):
    for argv, msg in ((["query", "SELEC 1", "--logs", str(logs)], "query failed: Parser Error"),
                      (["query", "SELECT 1", "--logs", str(tmp_path / "x")], "no logs directory"),
                      (["query", "--example", "nope", "--logs", str(logs)], "no example query 'nope'"),
                      (["query", "--logs", str(logs)], "no query")):
        rc, out, err = _cli(argv, capsys)
        assert rc == 2 and err.count("\n") == 1 and err.startswith("draftgym: error: ") and msg in err, err


# ---------------------------------------------------------------------------------------------- notebook

def test_notebook_runs_on_tiny_logs(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    from jupyter_client.kernelspec import KernelSpecManager

    spec = KernelSpecManager().get_kernel_spec("python3")
    # the kernel must run this interpreter (the venv's): jupyter_client swaps a bare "python" for sys.executable
    assert spec.argv[0] in ("python", "python3", sys.executable), spec.argv
    logs = make_logs(tmp_path / "logs", latency=True)
    monkeypatch.setenv("DRAFTGYM_LOGS", str(logs))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    nb = nbformat.read(ROOT / "notebooks" / "01_explore_logs.ipynb", as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell("import sys; print('EXE', sys.executable)"))
    nbclient.NotebookClient(nb, kernel_name="python3", timeout=120,
                            resources={"metadata": {"path": str(ROOT / "notebooks")}}).execute()
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert f"EXE {sys.executable}" in text
    images = sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert images >= 4, text


def test_notebook_skips_empty_latency(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    logs = make_logs(tmp_path / "logs", latency=False)
    monkeypatch.setenv("DRAFTGYM_LOGS", str(logs))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    nb = nbformat.read(ROOT / "notebooks" / "01_explore_logs.ipynb", as_version=4)
    nbclient.NotebookClient(nb, kernel_name="python3", timeout=120,
                            resources={"metadata": {"path": str(ROOT / "notebooks")}}).execute()
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "latency table is empty" in text


def test_docs_hold_every_example():
    doc = (ROOT / "docs" / "queries.md").read_text()
    for name, sql in EXAMPLES.items():
        assert f"### `{name}`" in doc and sql.strip() in doc, f"docs/queries.md is out of date for {name}"
