"""`draftgym query`: DuckDB views (and Polars lazy scans) over the Parquet logs.

    con = connect("data/logs")          # validates every shard, then creates the views below
    con.sql(EXAMPLES["tau_by_depth_size"]).pl()   # EXAMPLES: pipeline.logs.query_examples

Views (all of them always exist; a table without shards gives an empty view of the right columns):

- sequences       one row per committed (run_key, prompt_id)
- positions       one row per (run_key, prompt_id, position, width), committed rows only: positions
                  whose (run_key, prompt_id) has a sequences row (a killed collection actor can leave
                  orphan positions shards behind; `positions_raw` still shows them)
- latency, cycles the latency profiles and the online cycles
- batch_steps     one row per serving step of a batched run (per-row L as a list column)
- failures        one row per prompt whose collection raised, or that was skipped as unusable (empty,
                  too long: error 'skipped: <why>'), with config and environment; a successful
                  `draftgym collect --retry-failed` deletes its row
- acceptance_long one row per (position row, D, V): run_key, prompt_id, model, dataset, temperature,
                  width, position, context_len, depth, verify_size, accepted, using each sequence's
                  own max_depth and verify_grid (acceptance[(D-1) * n_grid + i] = L[D-1, i])

Every view has the hive partition columns model, dataset, temperature (VARCHAR, VARCHAR, DOUBLE;
NULL where a shard is not under a `key=value` folder). Their values are the path-safe names of
`pipeline.logs.schema.partition_dir` ('/' in a model id becomes '--').

Macro: accepted_at(acceptance, verify_grid, D, V) -> L of the static (D, V) tree for one positions
row joined with its sequences row (NULL if V is not on the grid).

The views read the shards found (and checked) when `connect` ran; reconnect to see new ones.
"""
from __future__ import annotations

import csv
import json
import math
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.errors import DataError, DraftGymError, first_line
from pipeline.logs.schema import (BATCH_STEPS, CYCLES, DEFAULT_MAX_DEPTH, DEFAULT_VERIFY_GRID, FAILURES, LATENCY, PARTITIONS,
                             SEQUENCES, check_file, positions_schema, table_files)

TABLES = ("sequences", "positions", "latency", "cycles", "failures", "batch_steps")
PARTITION_TYPES = {"model": "VARCHAR", "dataset": "VARCHAR", "temperature": "DOUBLE"}
DEFAULT_LOGS = "data/logs"
LOGS_ENV = "DRAFTGYM_LOGS"


# ----------------------------------------------------------------------------------------------
# shards: find, validate, partition keys
# ----------------------------------------------------------------------------------------------

def resolve_logs(logs_dir: str | Path | None) -> Path:
    """The logs root: the argument, else $DRAFTGYM_LOGS, else data/logs: a local directory, a file://
    URI, or an s3:// / gs:// URI read through its up-to-date local mirror (pipeline.logs.storage)."""
    from pipeline.logs.storage import local_dir

    root = local_dir(logs_dir if logs_dir is not None else os.environ.get(LOGS_ENV, DEFAULT_LOGS),
                     "draftgym query").expanduser()
    if not root.exists():
        raise DraftGymError(f"no logs directory at {root} (run `draftgym collect --out {root}` or pass --logs)")
    if not root.is_dir():
        raise DraftGymError(f"{root} is not a directory")
    return root


def shards(logs_dir: str | Path, table: str, validate: bool = True) -> list[Path]:
    """The Parquet shards of one table (temp files excluded), each checked with `check_file`:
    a corrupt, partial, foreign or other-version file raises a one-line DataError naming it."""
    if table not in TABLES:
        raise DraftGymError(f"unknown table {table!r} (one of {', '.join(TABLES)})")
    files = table_files(logs_dir, table)
    if validate:
        for f in files:
            check_file(f, table)
    return files


def _hive_keys(root: Path, table: str, files: list[Path]) -> list[str]:
    """The `key=value` folder names between <root>/<table>/ and each shard; the same for every shard."""
    keys: list[str] | None = None
    for f in files:
        rel = f.relative_to(root / table).parts[:-1]
        k = [p.split("=", 1)[0] for p in rel if "=" in p]
        if keys is None:
            keys = k
        elif k != keys:
            raise DataError(f"{f} is partitioned by {k or 'nothing'}, other {table} shards by {keys or 'nothing'}")
    return keys or []


def _sql_str(s: str) -> str:
    return "'" + str(s).replace("'", "''") + "'"


# ----------------------------------------------------------------------------------------------
# DuckDB
# ----------------------------------------------------------------------------------------------

def _duck_type(t: pa.DataType) -> str:
    if pa.types.is_list(t) or pa.types.is_fixed_size_list(t) or pa.types.is_large_list(t):
        return _duck_type(t.value_type) + "[]"   # Parquet has no fixed-size list: DuckDB reads a LIST
    simple = {pa.int8(): "TINYINT", pa.int16(): "SMALLINT", pa.int32(): "INTEGER", pa.int64(): "BIGINT",
              pa.uint8(): "UTINYINT", pa.uint16(): "USMALLINT", pa.uint32(): "UINTEGER", pa.uint64(): "UBIGINT",
              pa.float32(): "FLOAT", pa.float64(): "DOUBLE", pa.string(): "VARCHAR", pa.large_string(): "VARCHAR",
              pa.bool_(): "BOOLEAN"}
    if t in simple:
        return simple[t]
    if pa.types.is_fixed_size_binary(t) or pa.types.is_binary(t):
        return "BLOB"                            # candidate_tail: float16 values, little-endian
    raise TypeError(f"no DuckDB type for {t}")


def _empty_schema(table: str) -> pa.Schema:
    return {"sequences": SEQUENCES, "latency": LATENCY, "cycles": CYCLES, "failures": FAILURES, "batch_steps": BATCH_STEPS,
            "positions": positions_schema(DEFAULT_MAX_DEPTH, 10, len(DEFAULT_VERIFY_GRID), with_dist=True)}[table]


def _table_sql(root: Path, table: str, files: list[Path]) -> str:
    """SELECT over the shards with hive partition columns, or an empty SELECT of the table's columns."""
    if not files:
        cols = [f"NULL::{_duck_type(f.type)} AS {f.name}" for f in _empty_schema(table)]
        cols += [f"NULL::{PARTITION_TYPES[k]} AS {k}" for k in PARTITIONS]
        return f"SELECT {', '.join(cols)} WHERE false"
    keys = _hive_keys(root, table, files)
    file_list = "[" + ", ".join(_sql_str(f.resolve().as_posix()) for f in files) + "]"
    if keys:
        types = ", ".join(f"{_sql_str(k)}: {_sql_str(PARTITION_TYPES.get(k, 'VARCHAR'))}" for k in keys)
        src = f"read_parquet({file_list}, hive_partitioning = true, union_by_name = true, hive_types = {{{types}}})"
    else:
        src = f"read_parquet({file_list}, hive_partitioning = false, union_by_name = true)"
    missing = [f"NULL::{PARTITION_TYPES[k]} AS {k}" for k in PARTITIONS if k not in keys]
    return f"SELECT *{''.join(', ' + m for m in missing)} FROM {src}"


ACCEPTANCE_LONG_SQL = """
CREATE OR REPLACE VIEW acceptance_long AS
WITH a AS (
    SELECT p.run_key, p.prompt_id, p.model, p.dataset, p.temperature, p.width, p.position, p.context_len,
           s.verify_grid, len(s.verify_grid) AS n_grid,
           unnest(p.acceptance) AS accepted,
           unnest(range(len(p.acceptance))) AS k
    FROM positions_raw p
    JOIN sequences s ON p.run_key = s.run_key AND p.prompt_id = s.prompt_id
)
SELECT run_key, prompt_id, model, dataset, temperature, width, position, context_len,
       (k // n_grid + 1)::SMALLINT AS depth,
       verify_grid[k % n_grid + 1]::SMALLINT AS verify_size,
       accepted::SMALLINT AS accepted
FROM a
"""

MACROS_SQL = """
CREATE OR REPLACE MACRO accepted_at(acceptance, verify_grid, d, v) AS
    CASE WHEN list_position(verify_grid, v) IS NULL THEN NULL
         ELSE acceptance[(d - 1) * len(verify_grid) + list_position(verify_grid, v)] END
"""


def connect(logs_dir: str | Path | None = None, validate: bool = True, database: str = ":memory:"):
    """An in-memory DuckDB connection with the views of this module's docstring over `logs_dir`
    (default $DRAFTGYM_LOGS or data/logs). Every shard is checked first (`check_file`): a corrupt or
    partial file, or one of another schema version, raises a one-line DataError naming it."""
    import duckdb

    root = resolve_logs(logs_dir)
    files = {t: shards(root, t, validate) for t in TABLES}
    if not any(files.values()):
        raise DataError(f"no DraftGym logs under {root} (expected {', '.join(t + '/' for t in TABLES)} "
                        "with .parquet shards)")
    con = duckdb.connect(database)
    try:
        try:
            con.execute("SET enable_progress_bar = false")     # it would print into csv/json output
        except duckdb.Error:                                   # in Jupyter without ipywidgets
            pass
        threads = os.environ.get("OMP_NUM_THREADS", "")
        if threads.isdigit() and int(threads) > 0:     # share the cores like torch does
            con.execute(f"SET threads = {int(threads)}")
        for t in ("sequences", "latency", "cycles", "failures", "batch_steps"):
            con.execute(f"CREATE OR REPLACE VIEW {t} AS {_table_sql(root, t, files[t])}")
        con.execute(f"CREATE OR REPLACE VIEW positions_raw AS {_table_sql(root, 'positions', files['positions'])}")
        con.execute("CREATE OR REPLACE VIEW positions AS SELECT p.* FROM positions_raw p "
                    "SEMI JOIN sequences s ON p.run_key = s.run_key AND p.prompt_id = s.prompt_id")
        con.execute(ACCEPTANCE_LONG_SQL)
        con.execute(MACROS_SQL)
    except duckdb.Error as e:
        con.close()
        raise DataError(f"cannot read the logs under {root}: {first_line(e)}") from None
    return con


def run_sql(con, sql: str):
    """Execute SQL; a DuckDB error becomes a one-line DraftGymError. Returns (columns, rows) or None."""
    import duckdb

    try:
        rel = con.sql(sql)
        if rel is None:
            return None
        return rel.columns, rel.fetchall()
    except duckdb.Error as e:
        raise DraftGymError(f"query failed: {first_line(e)}") from None


# ----------------------------------------------------------------------------------------------
# Polars
# ----------------------------------------------------------------------------------------------

def scan(logs_dir: str | Path | None, table: str, committed: bool = True, validate: bool = True):
    """A Polars LazyFrame over one table with the hive partition columns (model, dataset,
    temperature). Shards are checked like `connect` does. For positions, `committed=True` keeps only
    rows whose (run_key, prompt_id) has a sequences row. Fixed-size list columns stay pl.Array where
    every shard agrees on their size (acceptance usually does) and become pl.List otherwise (the
    per-W score columns when several widths were logged). A table without shards gives an empty frame."""
    import polars as pl

    root = resolve_logs(logs_dir)
    files = shards(root, table, validate)
    if not files:
        empty = pa.Table.from_batches([], schema=_empty_schema(table))
        return pl.from_arrow(empty).lazy().with_columns(pl.lit(None, pl.String).alias("model"), pl.lit(None, pl.String).alias("dataset"),
                               pl.lit(None, pl.Float64).alias("temperature"))
    keys = _hive_keys(root, table, files)
    hive_schema = {k: (pl.Float64 if PARTITION_TYPES.get(k) == "DOUBLE" else pl.String) for k in keys}
    groups: dict[str, list[Path]] = {}
    for f in files:     # shards with one Arrow schema scan together
        try:
            schema = pq.read_schema(f).remove_metadata()
        except (pa.ArrowInvalid, OSError) as e:
            raise DataError(f"corrupt or partial Parquet file {f}: {first_line(e)}") from None
        groups.setdefault(str(schema), []).append(f)
    frames = [pl.scan_parquet([str(f) for f in g], hive_partitioning=bool(keys), hive_schema=hive_schema or None)
              for g in groups.values()]
    if len(frames) > 1:
        dtypes: dict[str, set] = {}
        for lf in frames:
            for name, dt in lf.collect_schema().items():
                dtypes.setdefault(name, set()).add(dt)
        conflicting = {n for n, ds in dtypes.items() if len(ds) > 1}
        frames = [lf.with_columns([pl.col(n).cast(pl.List(lf.collect_schema()[n].inner))
                                   for n in conflicting if n in lf.collect_schema()
                                   and isinstance(lf.collect_schema()[n], pl.Array)]) for lf in frames]
        lf = pl.concat(frames, how="diagonal_relaxed")
    else:
        lf = frames[0]
    for k in PARTITIONS:
        if k not in keys:
            lf = lf.with_columns(pl.lit(None, pl.Float64 if k == "temperature" else pl.String).alias(k))
    if table == "positions" and committed:
        seq = scan(root, "sequences", validate=validate).select("run_key", "prompt_id").unique()
        lf = lf.join(seq, on=["run_key", "prompt_id"], how="semi")
    return lf


def acceptance_array(df, max_depth: int | None = None, n_grid: int | None = None):
    """The acceptance column of a positions frame (Polars DataFrame/LazyFrame or Arrow table) as a
    numpy uint8 array [rows, max_depth, n_grid], L[row, D-1, i] with V = verify_grid[i].
    max_depth/n_grid default to the frame's `max_depth`/`verify_grid` columns (after a join with
    sequences), else max_depth = 12 and n_grid = row length / max_depth. All rows must agree."""
    import polars as pl

    if isinstance(df, pl.LazyFrame):
        df = df.collect()
    if isinstance(df, pa.Table):
        df = pl.from_arrow(df)
    if "max_depth" in df.columns and max_depth is None:
        u = df["max_depth"].unique().to_list()
        if len(u) > 1:
            raise DataError(f"rows of several max_depth values {sorted(u)}: select one run first")
        max_depth = int(u[0]) if u else None
    if "verify_grid" in df.columns and n_grid is None:
        u = df["verify_grid"].list.len().unique().to_list()
        if len(u) > 1:
            raise DataError("rows of several verify grids: select one run first")
        n_grid = int(u[0]) if u else None
    max_depth = max_depth or DEFAULT_MAX_DEPTH
    col = df["acceptance"]
    if len(col) == 0:
        return np.zeros((0, max_depth, n_grid or len(DEFAULT_VERIFY_GRID)), np.uint8)
    if isinstance(col.dtype, pl.List):
        lens = col.list.len().unique().to_list()
        if len(lens) > 1:
            raise DataError(f"acceptance rows of several lengths {sorted(lens)}: select one run first")
        col = col.cast(pl.Array(col.dtype.inner, int(lens[0])))
    flat = col.to_numpy()
    n = flat.shape[1]
    n_grid = n_grid or n // max_depth
    if max_depth * n_grid != n:
        raise DataError(f"acceptance rows hold {n} values, not max_depth * n_grid = {max_depth} * {n_grid}")
    return np.ascontiguousarray(flat, dtype=np.uint8).reshape(len(df), max_depth, n_grid)


# ----------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------

@dataclass
class QueryConfig:
    """`draftgym query`: one SQL query (or a named example) over the Parquet logs' views."""

    sql: str | None = None              # a DuckDB SQL query over the views (or give `example`)
    logs: str | None = None             # logs directory or file:// URI; None: $DRAFTGYM_LOGS or data/logs
    format: str = "table"               # table | csv | json
    example: str | None = None          # run this named example query instead of `sql` (EXAMPLES)
    list_examples: bool = False         # list the example queries and exit
    show_sql: bool = False              # print the SQL that runs (to stderr)
    max_rows: int = 40                  # table format: rows shown


def _jsonable(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    try:
        return float(v)        # Decimal, numpy scalars
    except (TypeError, ValueError):
        return str(v)


def run_query_command(cfg: QueryConfig) -> int:
    import duckdb

    from pipeline.logs.query_examples import EXAMPLE_HELP, EXAMPLES, example

    out = sys.stdout
    if cfg.list_examples:
        width = max(map(len, EXAMPLES))
        for name in EXAMPLES:
            print(f"{name:<{width}}  {EXAMPLE_HELP.get(name, '')}", file=out)
        return 0
    if cfg.example and cfg.sql:
        raise DraftGymError("give either SQL or --example NAME, not both")
    if not cfg.example and not cfg.sql:
        raise DraftGymError("no query: give SQL, --example NAME or --list-examples")
    sql = example(cfg.example) if cfg.example else cfg.sql
    if cfg.show_sql:
        print(sql, file=sys.stderr)
    con = connect(cfg.logs)
    try:
        if cfg.format == "table":
            try:
                rel = con.sql(sql)
                if rel is not None:
                    rel.show(max_rows=cfg.max_rows, max_width=_term_width())
            except duckdb.Error as e:
                raise DraftGymError(f"query failed: {first_line(e)}") from None
            return 0
        res = run_sql(con, sql)
    finally:
        con.close()
    if res is None:
        return 0
    cols, rows = res
    if cfg.format == "csv":
        w = csv.writer(out, lineterminator="\n")
        w.writerow(cols)
        for r in rows:
            w.writerow([json.dumps(_jsonable(v)) if isinstance(v, (list, dict, tuple)) else
                        ("" if v is None else v) for v in r])
    else:
        json.dump([{c: _jsonable(v) for c, v in zip(cols, r)} for r in rows], out, indent=1)
        out.write("\n")
    return 0


def _term_width() -> int:
    return max(80, shutil.get_terminal_size((160, 24)).columns)
