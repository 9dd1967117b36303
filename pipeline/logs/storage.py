"""Where logs are written: a local path or any pyarrow filesystem URI (file://, s3://, gs://).

`resolve_out` runs on the driver, so a relative local path means the driver's directory, not each
Ray worker's. The resulting `LogStore` (a pyarrow FileSystem plus a root path on it) pickles, so it
travels to the collection actors as it is; they write through it, and the driver's resume and
orphan checks read through it too.

Atomic writes (pipeline.runtime.atomic): on a local filesystem a file is written under a temp name
(`.<name>.<rand>.tmp`) and moved into place (rename); on an object store (S3, GCS) a single put is
already atomic, so the file is written to its final key.

Readers (`draftgym query`, `simulator.logs.replay_logs`, the notebooks) read local directories: `local_dir` turns
a `file://` URI into a path, and an object-store URI (s3://, gs://) into a local mirror of it under
`$DRAFTGYM_CACHE/logs-mirror/`, brought up to date on each call (new and changed files are
downloaded, files gone from the store are dropped; unchanged files, by size and modification time,
are not read again). DuckDB could read S3 itself, but only with its httpfs extension, which it
downloads at run time from its own server; pyarrow's filesystems need nothing beyond the package.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable

import pyarrow.fs as pafs

from pipeline.errors import DraftGymError, first_line
from pipeline.runtime.atomic import atomic_write, atomic_write_json, atomic_write_text


def is_uri(s: str | Path) -> bool:
    return isinstance(s, str) and "://" in s


def resolve_out(out: str | Path) -> "LogStore":
    """A local path (made absolute here, on the driver) or a pyarrow filesystem URI -> LogStore.
    A URI pyarrow cannot open (unknown scheme, bad query parameters, missing S3/GCS support) is a
    one-line DraftGymError."""
    if not is_uri(out):
        root = Path(out).expanduser().absolute()
        return LogStore(pafs.LocalFileSystem(), root.as_posix(), root.as_posix())
    try:
        fs, path = pafs.FileSystem.from_uri(out)
    except (ValueError, OSError, ImportError, NotImplementedError) as e:    # ArrowInvalid is a ValueError
        raise DraftGymError(f"cannot open --out {out}: {first_line(e)}") from None
    return LogStore(fs, path.rstrip("/"), out)


def local_dir(path: str | Path, what: str = "this command", tables: tuple[str, ...] | None = None) -> Path:
    """A readers' logs root: a local path, a file:// URI as a path, or an object-store URI as an
    up-to-date local mirror (`mirror_logs`; `tables`: of those tables only)."""
    if not is_remote(path):
        return Path(resolve_out(path).root) if is_uri(path) else Path(path)
    return mirror_logs(str(path), what=what, tables=tables)


def is_remote(path: str | Path) -> bool:
    """An object-store URI (s3://, gs://, ...): not a local path, not file://."""
    return is_uri(path) and not str(path).startswith("file://")


def mirror_dir(uri: str) -> Path:
    """Where the mirror of a logs URI lives: $DRAFTGYM_CACHE/logs-mirror/<bucket and prefix>-<hash>."""
    from pipeline.runtime.cache import cache_dir

    bare = uri.split("?", 1)[0]
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", bare.split("://", 1)[-1])[-60:]
    return cache_dir() / "logs-mirror" / f"{slug}-{hashlib.sha1(uri.encode()).hexdigest()[:8]}"


def mirror_logs(uri: str, what: str = "this command", progress: bool = True,
                tables: tuple[str, ...] | None = None) -> Path:
    """Bring the local mirror of the logs under `uri` up to date and return its path.

    Files are compared by size and modification time (recorded in the mirror's `.index.json`); new
    or changed ones are downloaded (to a temp name, then renamed), and local files whose key is gone
    are deleted. `tables`: only those tables' files (the streamed readers mirror `sequences` and
    `latency` and read positions shards from the store itself). An unreachable store or a missing
    prefix is a one-line DraftGymError."""
    from tqdm import tqdm

    store = resolve_out(uri)
    local = mirror_dir(uri)
    bare = uri.split("?", 1)[0]                          # the URI without its query parameters
    try:
        infos = [i for i in store.fs.get_file_info(pafs.FileSelector(store.root, recursive=True))
                 if i.type == pafs.FileType.File]
    except (OSError, ValueError) as e:
        raise DraftGymError(f"{what} cannot read logs at {uri}: {first_line(e)}") from None
    index_path = local / ".index.json"
    index = json.loads(index_path.read_text()) if index_path.is_file() else {}
    remote = {}
    mine = lambda rel: tables is None or rel.split("/", 1)[0] in tables
    for i in infos:
        rel = i.path[len(store.root):].lstrip("/")
        if not rel or any(part.startswith(".") for part in rel.split("/")) or not mine(rel):
            continue                                     # temp files of a writer in progress; other tables
        remote[rel] = [i.size, i.mtime_ns]
    todo = [r for r, sig in remote.items() if index.get(r) != sig or not (local / r).is_file()]
    for rel in [r for r in index if r not in remote and mine(r)]:    # gone from the store
        (local / rel).unlink(missing_ok=True)
        index.pop(rel)
    for rel in tqdm(todo, desc=f"mirror {bare}", unit="file", disable=not progress or len(todo) < 20):
        try:
            atomic_write(local / rel, partial(_copy_stream, store.fs, store.path(rel)))
        except OSError as e:
            raise DraftGymError(f"{what} cannot read {bare}/{rel}: {first_line(e)}") from None
        index[rel] = remote[rel]
    atomic_write_text(index_path, json.dumps(index))
    return local


def _copy_stream(fs: pafs.FileSystem, path: str, out) -> None:
    """Copy the file `path` on `fs` into the stream `out`, 4 MiB at a time."""
    with fs.open_input_stream(path) as src:
        while chunk := src.read(1 << 22):
            out.write(chunk)


@dataclass(frozen=True)
class LogStore:
    """A logs root on a pyarrow filesystem. Paths are '/'-joined strings on that filesystem."""

    fs: pafs.FileSystem
    root: str
    uri: str            # as the user gave it (for messages); local paths: the absolute path

    def path(self, *parts: str | Path) -> str:
        return "/".join([self.root.rstrip("/")] + [str(p).strip("/") for p in parts if str(p)])

    def list_files(self, directory: str, suffix: str = "") -> list[str]:
        """Base names of the files directly in `directory` ending in `suffix` ([] if it does not exist)."""
        sel = pafs.FileSelector(directory, allow_not_found=True, recursive=False)
        return sorted(i.base_name for i in self.fs.get_file_info(sel)
                      if i.type == pafs.FileType.File and i.base_name.endswith(suffix))

    def exists(self, path: str) -> bool:
        return self.fs.get_file_info(path).type != pafs.FileType.NotFound

    def delete(self, path: str) -> bool:
        """Delete a file if it is there; True if it was."""
        if not self.exists(path):
            return False
        self.fs.delete_file(path)
        return True

    def write_atomic(self, path: str, write: Callable[[object], None]) -> str:
        """Call write(stream) on an output stream that becomes `path` all at once (see the module doc)."""
        return atomic_write(path, write, fs=self.fs)

    def write_json(self, obj: dict, path: str) -> str:
        return atomic_write_json(obj, path, fs=self.fs)

