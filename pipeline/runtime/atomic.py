"""Atomic file writes: a reader sees the old file or the new one, never half of one.

On a local filesystem the bytes go to a hidden temp file beside the target (`.<name>.<rand>.tmp`,
in the same directory so the rename stays on one device) and are moved into place with rename(2),
which replaces an existing file in one step; a write that fails leaves no temp file behind. On an
object store (S3, GCS) one put is already atomic (a multipart upload becomes visible only when it
completes), so the file is written to its final key.

Every stage writes its files through `atomic_write` (logs, checkpoints, manifests, caches).
"""
from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import BinaryIO, Callable

LOCAL_TYPES = ("local",)        # pyarrow type_name of filesystems that support an atomic rename


def temp_name(name: str) -> str:
    """The hidden temp name a file `name` is written under before its rename (readers skip dot-files)."""
    return f".{name}.{uuid.uuid4().hex[:8]}.tmp"


def atomic_write(path: str | Path, write: Callable[[BinaryIO], object], fs=None) -> str | Path:
    """Call `write(stream)` on a binary output stream that becomes `path` all at once; returns `path`.

    `fs`: a pyarrow FileSystem and `path` a path on it; None = the local disk (parent directories
    are made). `write` may be `lambda f: f.write(data)`, `lambda f: np.save(f, a)`,
    `lambda f: torch.save(obj, f)`, `lambda f: pq.write_table(table, f)` ..."""
    if fs is None:
        return _write_local(Path(path), write)
    return _write_fs(fs, str(path), write)


def atomic_write_text(path: str | Path, text: str) -> Path:
    """A text file (UTF-8) on the local disk, written atomically."""
    data = text.encode()
    return atomic_write(Path(path), lambda f: f.write(data))


def atomic_write_json(obj, path: str | Path, fs=None) -> str | Path:
    """Indented JSON (values it cannot encode written as str), atomically; `fs` as in `atomic_write`."""
    data = (json.dumps(obj, indent=2, default=str) + "\n").encode()
    return atomic_write(path, lambda f: f.write(data), fs=fs)


def _write_local(path: Path, write) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(temp_name(path.name))
    try:
        with open(tmp, "wb") as f:
            write(f)
        os.replace(tmp, path)                     # rename(2): atomic, replaces an existing file
    finally:
        tmp.unlink(missing_ok=True)
    return path


def _write_fs(fs, path: str, write) -> str:
    import pyarrow.fs as pafs

    parent, name = path.rsplit("/", 1) if "/" in path else ("", path)
    if parent:
        fs.create_dir(parent, recursive=True)
    if fs.type_name not in LOCAL_TYPES:          # object store: one put is atomic
        with fs.open_output_stream(path) as f:
            write(f)
        return path
    tmp = f"{parent}/{temp_name(name)}" if parent else temp_name(name)
    try:
        with fs.open_output_stream(tmp) as f:
            write(f)
        fs.move(tmp, path)                        # rename(2): atomic, replaces an existing file
    finally:
        if fs.get_file_info(tmp).type != pafs.FileType.NotFound:
            fs.delete_file(tmp)
    return path
