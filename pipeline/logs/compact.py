"""`draftgym compact-logs`: rewrite version-2 positions shards in the version-3 layout, in place.

Version 3 (pipeline/logs/candidates.py) replaces each row's `candidate_scores` [Dmax * W * W] float32
by `candidate_tail` (a fixed-size binary of [Dmax, W*W - W] float16), the candidates below the beams,
sorted and floored: about a third of the bytes on disk, the same replay (acceptance is untouched) and the same
observations up to float16 rounding of the tail. Every other column, and every other table, is kept
as it is.

Each shard is read, converted and written back under its own name through `write_atomic` (temp file +
rename), so an interrupted run leaves every shard either old or new, and a rerun converts only what is
still version 2 (idempotent). A shard that cannot be read is named and skipped; the command's exit
status is 1 when any was.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from pipeline.errors import DataError, DraftGymError
from pipeline.logs.candidates import candidate_tail
from pipeline.logs.schema import (SCHEMA_VERSION, VERSION_KEY, check_file, positions_schema, table_files, tail_array,
                                  write_atomic)
from pipeline.logs.storage import is_remote, local_dir


@dataclass
class CompactLogsConfig:
    """`draftgym compact-logs`: convert the positions shards under `logs` to schema version 3."""

    logs: str = "data/logs"          # logs root: a directory or file:// URI (object stores: compact a local copy)
    dry_run: bool = False            # count what would be converted, write nothing
    progress: bool = True
    as_json: bool = False


def convert_positions(t: pa.Table, path: Path | str = "") -> pa.Table:
    """A version-2 positions table -> the version-3 table of the same rows (module doc)."""
    if len(set(t.column("width").to_pylist())) > 1:
        raise DataError(f"{path}: a positions shard of several widths (one shard holds one width)")
    W = int(t.column("width")[0].as_py()) if len(t) else 1
    Dm = t.schema.field("beam_scores").type.list_size // W
    n_grid = t.schema.field("acceptance").type.list_size // Dm
    schema = positions_schema(Dm, W, n_grid, with_dist="accept_dist" in t.column_names)
    cols = {name: t.column(name) for name in t.column_names if name != "candidate_scores"}
    if W > 1:
        cand = t.column("candidate_scores").combine_chunks().flatten().to_numpy(zero_copy_only=False)
        cols["candidate_tail"] = tail_array(candidate_tail(np.asarray(cand, np.float32).reshape(len(t), Dm, W * W), W))
    cols["schema_version"] = pa.array(np.full(len(t), SCHEMA_VERSION, np.int16))
    return pa.Table.from_arrays([cols[f.name] for f in schema], schema=schema)


def compact_logs(cfg: CompactLogsConfig) -> dict:
    from tqdm import tqdm

    if is_remote(cfg.logs):
        raise DraftGymError(f"compact-logs rewrites files in place: copy {cfg.logs} to a local directory first")
    root = local_dir(cfg.logs, "compact-logs")
    files = table_files(root, "positions")
    if not files:
        raise DraftGymError(f"no positions shards under {root}/positions")
    out = {"logs": str(root), "shards": len(files), "converted": 0, "already_v3": 0, "bad": [], "rows": 0,
           "bytes_before": 0, "bytes_after": 0}
    t0 = time.perf_counter()
    bar = tqdm(files, desc="compact-logs", unit="shard", disable=not cfg.progress)
    for f in bar:
        try:
            pf = check_file(f, "positions")
            if int((pf.schema_arrow.metadata or {})[VERSION_KEY]) >= 3:
                out["already_v3"] += 1
                continue
            before = f.stat().st_size
            new = convert_positions(pf.read(), f)
        except (DataError, pa.ArrowInvalid, OSError, ValueError) as e:
            out["bad"].append(f"{f}: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
            continue
        out["rows"] += len(new)
        if not cfg.dry_run:
            write_atomic(new, f, "positions")
            out["bytes_before"] += before
            out["bytes_after"] += f.stat().st_size
        out["converted"] += 1
        bar.set_postfix(rows_per_s=f"{out['rows'] / max(time.perf_counter() - t0, 1e-9):,.0f}")
    out["seconds"] = round(time.perf_counter() - t0, 2)
    if out["rows"] and out["bytes_after"]:
        out["bytes_per_row_before"] = round(out["bytes_before"] / out["rows"], 1)
        out["bytes_per_row_after"] = round(out["bytes_after"] / out["rows"], 1)
    return out


def run_compact_logs_command(cfg: CompactLogsConfig) -> int:
    out = compact_logs(cfg)
    if cfg.as_json:
        print(json.dumps(out))
    else:
        verb = "would convert" if cfg.dry_run else "converted"
        print(f"{out['logs']}: {verb} {out['converted']} of {out['shards']} positions shards ({out['rows']:,} rows), "
              f"{out['already_v3']} already version 3, {len(out['bad'])} unreadable, {out['seconds']} s")
        if out.get("bytes_per_row_after"):
            print(f"bytes per row: {out['bytes_per_row_before']:,} -> {out['bytes_per_row_after']:,}")
    for b in out["bad"]:
        print(f"skipped {b}", file=sys.stderr)
    return 1 if out["bad"] else 0
