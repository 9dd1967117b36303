"""Parquet tables of DraftGym logs: schemas, versions, layout, atomic writes and checked reads.

Layout (hive partitions, DuckDB/Polars read them directly):

    <logs>/<table>/model=<model>/dataset=<dataset>/temperature=<T>/<shard>.parquet
    <logs>/_runs/<run_key>.json          config + environment fingerprint of each collection run

Tables (SCHEMA_VERSION is stored in every file's key-value metadata as `draftgym.schema_version`
and in a `schema_version` column; readers refuse other versions with a one-line error):

- sequences: one row per (run_key, prompt_id): the prompt, the logged continuation, the config.
- positions: one row per (run_key, prompt_id, position, width). Position p means: the root of the
  cycle is output token y_p (already emitted), the context is prompt + y_0..y_{p-1}. Holds
    acceptance  [max_depth * len(verify_grid)] uint8: L[D-1, i] = tokens accepted by the static
                tree (D, W, verify_grid[i]) rooted at p, matched against the logged continuation
    beam_scores [max_depth * W] float32: per depth d, the W beam cumulative log-probs after forward d
                (d = 1: the root's top-W children); they are the best W of that level's candidates
    candidate_tail fixed-size binary, [max_depth, W*W - W] float16 little-endian: per depth, the level's
                other W*W - W candidate scores, best first, floored at -20 (pipeline/logs/candidates.py). Version 2 stored
                candidate_scores [max_depth * W * W] float32 (unsorted, NaN where missing) instead.
                W = 1 (a chain: no candidate below the beam) has no candidate_tail column;
                both read (`READABLE_VERSIONS`), `draftgym compact-logs` rewrites version 2 as 3.
    entropy     [max_depth * W] float32: per depth, the entropy (nats) of each expanded beam's child
                distribution (d = 1: the root's, slot 0, rest NaN)
    accept_dist [max_depth * (max_depth + 1)] float32, T > 0 only: P(L = l) for the tree (D, W, V_dist)
- latency: one row per measured op (draft_step, verify, policy, overhead, prefill) and parameters.
- cycles: one row per online verify cycle (written by `online/`), comparable row for row with replay.
- batch_steps: one row per serving step of a batched run (B rows, one shape for the step): the shape,
  each active row's L (list column) and the step's timed phases (`write_batch_steps`).
- failures: one row per (run_key, prompt_id) whose collection raised (an out-of-memory error, a bug):
  the error (type and first line), the config and the actor's environment. A rerun skips these
  prompts unless `draftgym collect --retry-failed`; a successful retry deletes the row.

Replay: from p the static (D, W, V) accepts L = acceptance[D-1, index(V)] and the next cycle's root
is p + L + 1. An episode ends once p >= new_tokens - 1 (the last token is emitted).
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.errors import DataError, first_line
from pipeline.logs.candidates import candidate_tail
from pipeline.runtime.atomic import atomic_write

SCHEMA_VERSION = 3                 # 2: sequences.dtype (logs carry the dtype they were collected in)
                                   # 3: positions.candidate_tail (compact candidates) replaces candidate_scores
READABLE_VERSIONS = (2, 3)         # versions the readers take (the other tables did not change in 3)
VERSION_KEY = b"draftgym.schema_version"
TABLE_KEY = b"draftgym.table"

# V grid of the acceptance table: 1, 2, 4, 8, then 10..240 in steps of 10 (docs/design.md, "Tables")
DEFAULT_VERIFY_GRID: tuple[int, ...] = (1, 2, 4, 8) + tuple(range(10, 241, 10))
DEFAULT_MAX_DEPTH = 12             # deepest draft level collected (LTD's D <= 12)
PARTITIONS = ("model", "dataset", "temperature")

SEQUENCES = pa.schema([
    ("schema_version", pa.int16()),
    ("run_key", pa.string()),          # hash of the collection config: same command -> same key
    ("prompt_id", pa.string()),
    ("split", pa.string()),
    ("model_id", pa.string()),
    ("head_id", pa.string()),
    ("dtype", pa.string()),                    # the target's compute dtype: float32 | bfloat16 | float16
    ("seed", pa.int64()),
    ("prompt_tokens", pa.list_(pa.int32())),
    ("output_tokens", pa.list_(pa.int32())),   # logged continuation y_0.. (incl. lookahead past new_tokens)
    ("new_tokens", pa.int32()),                # episode length T: max_new_tokens, or up to EOS
    ("stop_reason", pa.string()),
    ("widths", pa.list_(pa.int16())),
    ("max_depth", pa.int16()),
    ("verify_grid", pa.list_(pa.int16())),
    ("config_json", pa.string()),
    ("env_json", pa.string()),
    ("collect_s", pa.float64()),               # wall time spent on this prompt (with batching: its share of the batch)
])


def positions_schema(max_depth: int, width: int, n_grid: int, with_dist: bool) -> pa.Schema:
    """The positions schema of one width (version 3; the module doc)."""
    fields = [
        ("schema_version", pa.int16()),
        ("run_key", pa.string()),
        ("prompt_id", pa.string()),
        ("position", pa.int32()),
        ("context_len", pa.int32()),
        ("width", pa.int16()),
        ("root_token", pa.int32()),
        ("acceptance", pa.list_(pa.uint8(), max_depth * n_grid)),
        ("beam_scores", pa.list_(pa.float32(), max_depth * width)),
        ("candidate_tail", pa.binary(2 * max_depth * (width * width - width))),   # float16 LE [Dmax, W*W - W]
        ("entropy", pa.list_(pa.float32(), max_depth * width)),
    ]
    if width == 1:               # a chain has no candidate below its beam: no tail column
        fields = [f for f in fields if f[0] != "candidate_tail"]
    if with_dist:
        fields.append(("accept_dist", pa.list_(pa.float32(), max_depth * (max_depth + 1))))
    return pa.schema(fields)


def tail_array(tail: np.ndarray) -> pa.Array:
    """[n, ...] float16 candidate tails -> the candidate_tail column: one fixed-size binary value per row,
    the row's float16 values little-endian (Parquet FIXED_LEN_BYTE_ARRAY: read back with one
    np.frombuffer, several times faster than a list column of W*W - W values a level)."""
    t = np.ascontiguousarray(tail, "<f2").reshape(len(tail), -1)
    return pa.FixedSizeBinaryArray.from_buffers(pa.binary(2 * t.shape[1]), len(t), [None, pa.py_buffer(t.tobytes())])


def tail_values(col: pa.Array | pa.ChunkedArray, shape: tuple[int, ...]) -> np.ndarray:
    """The candidate_tail column -> [n, *shape] float16 (a view of the column's buffer)."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    size = int(np.prod(shape))
    if arr.type.byte_width != 2 * size:
        raise ValueError(f"candidate_tail of {arr.type.byte_width} bytes a row, expected {2 * size}")
    flat = np.frombuffer(arr.buffers()[1], "<f2", count=len(arr) * size, offset=arr.offset * 2 * size)
    return flat.reshape((len(arr),) + tuple(shape))


def positions_table(run_key, prompt_id, position, context_len, width: int, root_token, acceptance, beam_scores,
                    candidate_scores, entropy, accept_dist=None, max_depth: int | None = None,
                    n_grid: int | None = None) -> pa.Table:
    """One width's positions rows as a table of this version. One row per position: run_key and
    prompt_id ([n] str, or one str for all), position, context_len, root_token [n]; acceptance
    [n, Dmax, G]; beam_scores [n, Dmax, W]; candidate_scores [n, Dmax, W*W] (any order, NaN where
    missing: stored as `candidate_tail`); entropy [n, Dmax, W]; accept_dist [n, Dmax, Dmax+1], or a
    list of rows with None where not logged, or None. Arrays may come flattened per row (then pass
    max_depth and n_grid)."""
    acceptance = np.asarray(acceptance)
    n = len(acceptance)
    if acceptance.ndim != 3 and not (max_depth and n_grid):
        raise ValueError("positions_table: pass max_depth and n_grid with flattened acceptance rows")
    Dm, G = (max_depth, n_grid) if max_depth and n_grid else acceptance.shape[1:]
    schema = positions_schema(Dm, width, G, with_dist=accept_dist is not None)
    each = lambda x: [x] * n if isinstance(x, str) else [str(v) for v in x]
    cols = {"schema_version": pa.array(np.full(n, SCHEMA_VERSION, np.int16)),
            "run_key": pa.array(each(run_key), pa.string()), "prompt_id": pa.array(each(prompt_id), pa.string()),
            "position": pa.array(np.asarray(position, np.int32)), "context_len": pa.array(np.asarray(context_len, np.int32)),
            "width": pa.array(np.full(n, width, np.int16)), "root_token": pa.array(np.asarray(root_token, np.int32))}
    lists = {"acceptance": acceptance, "beam_scores": beam_scores, "entropy": entropy}
    if isinstance(accept_dist, np.ndarray):
        lists["accept_dist"] = accept_dist
    for name, val in lists.items():
        typ = schema.field(name).type
        flat = np.asarray(val).reshape(-1).astype(typ.value_type.to_pandas_dtype())
        if flat.size != n * typ.list_size:
            raise ValueError(f"{name}: {flat.size} values for {n} rows of {typ.list_size}")
        cols[name] = pa.FixedSizeListArray.from_arrays(pa.array(flat), typ.list_size)
    if width > 1:
        cand = np.asarray(candidate_scores, np.float32).reshape(n, Dm, width * width)
        cols["candidate_tail"] = tail_array(candidate_tail(cand, width))
    if accept_dist is not None and "accept_dist" not in cols:      # null: subsampled out (--dist-every)
        cols["accept_dist"] = pa.array([None if d is None else np.asarray(d).ravel().tolist() for d in accept_dist],
                                       type=schema.field("accept_dist").type)
    return pa.Table.from_arrays([cols[f.name] for f in schema], schema=schema)


LATENCY = pa.schema([
    ("schema_version", pa.int16()),
    ("profile_id", pa.string()),
    ("device", pa.string()),
    ("device_type", pa.string()),
    ("model_id", pa.string()),
    ("head_id", pa.string()),
    ("dtype", pa.string()),
    ("op", pa.string()),             # draft_step | verify | policy | overhead
    ("width", pa.int16()),           # W (draft_step); 0 where it does not apply
    ("verify_size", pa.int16()),     # V (verify); 0 where it does not apply
    ("context_len", pa.int32()),
    ("batch", pa.int16()),
    ("n", pa.int32()),
    ("median", pa.float64()),        # seconds
    ("p10", pa.float64()),
    ("p90", pa.float64()),
    ("mean", pa.float64()),
    ("env_json", pa.string()),
])

CYCLES = pa.schema([
    ("schema_version", pa.int16()),
    ("run_id", pa.string()),
    ("method", pa.string()),         # ar | static | grid-best | <policy name>
    ("prompt_id", pa.string()),
    ("run", pa.int16()),             # repeat index (Spec-Bench style runs)
    ("cycle", pa.int32()),
    ("position", pa.int32()),        # p at the cycle start (root = y_p)
    ("context_len", pa.int32()),
    ("depth", pa.int16()),
    ("width", pa.int16()),
    ("verify_size", pa.int16()),
    ("accepted", pa.int16()),
    ("emitted", pa.int16()),
    ("t_draft", pa.float64()),
    ("t_verify", pa.float64()),
    ("t_controller", pa.float64()),
    ("t_cycle", pa.float64()),
    ("device", pa.string()),
])

BATCH_STEPS = pa.schema([
    ("schema_version", pa.int16()),
    ("run_id", pa.string()),
    ("method", pa.string()),         # static | schedule | <policy name>
    ("run", pa.int16()),             # repeat index
    ("step", pa.int32()),            # serving step, 0-based within the run
    ("batch", pa.int16()),           # B: rows in the step's forwards (free slots included)
    ("active", pa.int16()),          # rows decoding in this step (<= B) = len(prompt_ids) = len(accepted)
    ("queue", pa.int32()),           # requests waiting to join (null: no queue)
    ("kind", pa.string()),           # tree | chain (W = 1, V = D + 1) | off (D = 0, V = 1: an AR step)
    ("depth", pa.int16()),           # D
    ("width", pa.int16()),           # W
    ("verify_size", pa.int16()),     # V, root included
    ("context_mean", pa.float64()),  # mean context length of the active rows at the step start
    ("context_max", pa.int32()),
    ("prompt_ids", pa.list_(pa.string())),   # the active rows' requests, in row order
    ("accepted", pa.list_(pa.int16())),      # L per active row (same order)
    ("accepted_sum", pa.int32()),            # sum of L
    ("emitted_sum", pa.int32()),             # tokens emitted by the step (sum of L + 1, less any cut at EOS / limit)
    ("t_draft", pa.float64()),       # seconds: the D head forwards over B x W rows (+ tree selection)
    ("t_verify", pa.float64()),      # the target forward over B x V tokens + acceptance + commit
    ("t_controller", pa.float64()),
    ("t_step", pa.float64()),        # the whole step, wall
    ("device", pa.string()),
])

STEP_KINDS = ("tree", "chain", "off")

FAILURES = pa.schema([
    ("schema_version", pa.int16()),
    ("run_key", pa.string()),
    ("prompt_id", pa.string()),
    ("dataset", pa.string()),          # as given (the partition folder holds its path-safe name)
    ("split", pa.string()),
    ("error", pa.string()),            # "<ExceptionType>: <first line of the message>"
    ("config_json", pa.string()),
    ("env_json", pa.string()),         # the fingerprint of the actor that failed
    ("time", pa.string()),             # UTC, ISO 8601
])


def prompt_hash(prompt_id: str) -> str:
    """The prompt's part of collection's shard names: `<run_key>-<prompt_hash>[-w<W>].parquet`."""
    return hashlib.sha1(prompt_id.encode()).hexdigest()[:16]


def partition_parts(table: str, model: str, dataset: str, temperature: float) -> tuple[str, str, str, str]:
    """(<table>, model=<model>, dataset=<dataset>, temperature=<T>), names made path-safe."""
    safe = lambda s: str(s).replace("/", "--").replace("=", "-")
    return table, f"model={safe(model)}", f"dataset={safe(dataset)}", f"temperature={float(temperature):g}"


def partition_dir(root: str | Path, table: str, model: str, dataset: str, temperature: float) -> Path:
    """<root>/<table>/model=<model>/dataset=<dataset>/temperature=<T>, names made path-safe."""
    return Path(root).joinpath(*partition_parts(table, model, dataset, temperature))


def step_kind(depth: int, width: int, verify_size: int) -> str:
    """The kind of a step's shape: off (D = 0: an AR step), chain (W = 1, V = D + 1), else tree."""
    if depth == 0:
        return "off"
    return "chain" if width == 1 and verify_size == depth + 1 else "tree"


def _batch_step_problem(d: dict, acc: list[int]) -> str | None:
    """What is inconsistent in one batch_steps row (None: nothing)."""
    shape = (d["depth"], d["width"], d["verify_size"])
    if len(acc) != d["active"] or len(d["prompt_ids"]) != d["active"]:
        return f"{len(acc)} accepted and {len(d['prompt_ids'])} prompt_ids for {d['active']} active rows"
    if not 0 < d["active"] <= d["batch"]:
        return f"{d['active']} active rows in a batch of {d['batch']}"
    if d["accepted_sum"] != sum(acc):
        return f"accepted_sum {d['accepted_sum']} != sum(accepted) {sum(acc)}"
    if d["kind"] != step_kind(*shape):
        return f"kind {d['kind']!r} for the shape {shape} (a {step_kind(*shape)})"
    if any(not 0 <= x <= d["depth"] for x in acc):
        return f"an accepted L outside 0..D = {d['depth']}"
    return None


def write_batch_steps(root: str | Path, model: str, dataset: str, temperature: float, run_id: str,
                      rows: list[dict]) -> Path:
    """One batched run's steps -> <root>/batch_steps/model=.../dataset=.../temperature=.../<run_id>.parquet.

    rows: dicts with the BATCH_STEPS columns; schema_version and run_id are filled in, and active,
    accepted_sum and kind are derived (from accepted and the shape) where absent. A row whose
    lists, sums or kind disagree with its shape is refused with a one-line DataError."""
    full = []
    for i, r in enumerate(rows):
        d = {"queue": None, "device": None, **r, "schema_version": SCHEMA_VERSION, "run_id": run_id}
        acc = [int(x) for x in d["accepted"]]
        d.setdefault("active", len(acc))
        d.setdefault("accepted_sum", sum(acc))
        d.setdefault("kind", step_kind(d["depth"], d["width"], d["verify_size"]))
        bad = _batch_step_problem(d, acc)
        if bad:
            raise DataError(f"batch_steps row {i} (step {d.get('step')}): {bad}")
        full.append(d)
    path = partition_dir(root, "batch_steps", model, dataset, temperature) / f"{run_id}.parquet"
    return write_atomic(pa.Table.from_pylist(full, schema=BATCH_STEPS), path, "batch_steps")


def write_atomic(table: pa.Table, path: str | Path, table_name: str, filesystem=None) -> str | Path:
    """Write a Parquet file so readers never see a partial file: temp file + rename on a local disk,
    one put on an object store (pipeline.logs.storage). `filesystem`: a pyarrow FileSystem and `path` a
    path on it; None = the local filesystem and a local path (returned as a Path)."""
    meta = dict(table.schema.metadata or {})
    meta[VERSION_KEY] = str(SCHEMA_VERSION).encode()
    meta[TABLE_KEY] = table_name.encode()
    table = table.replace_schema_metadata(meta)
    write = lambda f: pq.write_table(table, f, compression="zstd")
    if filesystem is not None:
        return atomic_write(str(path), write, fs=filesystem)
    return atomic_write(Path(path), write)


def check_file(path: str | Path, table_name: str | None = None, filesystem=None) -> pq.ParquetFile:
    """Open a Parquet shard, raising DataError (one line, naming the file) if it is truncated,
    corrupt, not ours, or of another schema version. filesystem: a pyarrow FileSystem `path` is on
    (an object store); None: a local path."""
    path = Path(path) if filesystem is None else str(path)
    try:
        pf = pq.ParquetFile(path if filesystem is None else filesystem.open_input_file(path))
    except FileNotFoundError:
        raise DataError(f"no such file: {path}") from None
    except (pa.ArrowInvalid, OSError) as e:
        raise DataError(f"corrupt or partial Parquet file {path}: {first_line(e)}") from None
    meta = pf.schema_arrow.metadata or {}
    version = meta.get(VERSION_KEY)
    if version is None:
        raise DataError(f"{path} is not a DraftGym log (no {VERSION_KEY.decode()} metadata)")
    if int(version) not in READABLE_VERSIONS:
        raise DataError(f"{path} has schema version {int(version)}, this DraftGym reads versions "
                        f"{', '.join(map(str, READABLE_VERSIONS))} (collect or profile it again)")
    if table_name is not None and meta.get(TABLE_KEY, b"").decode() != table_name:
        raise DataError(f"{path} holds table {meta.get(TABLE_KEY, b'?').decode()!r}, expected {table_name!r}")
    return pf


def read_table(path: str | Path, table_name: str | None = None, columns: list[str] | None = None,
               filesystem=None) -> pa.Table:
    return read_checked(check_file(path, table_name, filesystem), path, columns)


def read_checked(pf: pq.ParquetFile, path: str | Path, columns: list[str] | None = None) -> pa.Table:
    """The rows of a shard `check_file` opened (its columns, or all), DataError naming `path` if unreadable."""
    try:
        return pf.read(columns=columns)
    except (pa.ArrowInvalid, OSError) as e:
        raise DataError(f"corrupt or partial Parquet file {path}: {first_line(e)}") from None


def table_files(root: str | Path, table: str) -> list[Path]:
    """All shards of one table under a logs root (temp files excluded)."""
    base = Path(root) / table
    return sorted(p for p in base.rglob("*.parquet") if not p.name.startswith(".")) if base.is_dir() else []
