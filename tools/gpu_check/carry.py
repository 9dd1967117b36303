"""Carrying large files to an air-gapped machine in pieces: split, then join with every byte checked.

The GPU machines this project borrows (docs/gpu.md) have no network, and each call to one carries
the working tree plus whatever else it names, 64 MiB in all. A file larger than what is left over
(the embedded SmolLM2 GGUF: 94 MiB; its dequantised safetensors: 513 MiB) travels in parts, one or
a few per call, and is put back together there:

    split(file, out_dir, chunk_mb)   out_dir/<name>.part-000, .part-001, ... (each <= chunk_mb MiB)
                                     + out_dir/<name>.manifest.json
    join(dir) -> file                every part's sha256 checked against the manifest, then the
                                     whole file's; a missing, short or corrupted part is refused with
                                     a one-line error naming it, and nothing is left half-written

Manifest (JSON): {"format": "draftgym-carry/1", "name", "size", "sha256", "chunk_bytes",
"parts": [{"file", "size", "sha256"}, ...]}.

Why chunk_mb defaults to 32: the tracked tree travels with every call (about 24 MiB today), so a
part of 32 MiB plus the tree stays under 64 MiB. `headroom()` measures what is left for this
checkout (`python -m tools.gpu_check.carry headroom`).

Command line (no `draftgym` script is installed on the GPU machine, so this is a module):

    python -m tools.gpu_check.carry split FILE OUT_DIR [--chunk-mb 32]
    python -m tools.gpu_check.carry join DIR [--out FILE] [--name NAME]
    python -m tools.gpu_check.carry headroom
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from pipeline.errors import DraftGymError

FORMAT = "draftgym-carry/1"
MIB = 1 << 20
TRANSFER_LIMIT = 64 * MIB          # the working tree + carried paths of one call
DEFAULT_CHUNK_MB = 32


def manifest_path(out_dir: Path, name: str) -> Path:
    return Path(out_dir) / f"{name}.manifest.json"


def split(file: str | Path, out_dir: str | Path, chunk_mb: float = DEFAULT_CHUNK_MB) -> Path:
    """Cut `file` into parts of at most chunk_mb MiB under `out_dir`; write the manifest last.
    Returns the manifest's path."""
    src, out = Path(file), Path(out_dir)
    if not src.is_file():
        raise DraftGymError(f"carry split: no such file: {src}")
    if not chunk_mb > 0:
        raise DraftGymError(f"carry split: --chunk-mb must be > 0, got {chunk_mb}")
    chunk = max(1, int(chunk_mb * MIB))
    out.mkdir(parents=True, exist_ok=True)
    whole, parts = hashlib.sha256(), []
    with open(src, "rb") as f:
        while True:
            data = f.read(chunk)
            if not data and parts:
                break
            whole.update(data)
            part = out / f"{src.name}.part-{len(parts):03d}"
            part.write_bytes(data)
            parts.append({"file": part.name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()})
            if len(data) < chunk:
                break
    man = {"format": FORMAT, "name": src.name, "size": src.stat().st_size, "sha256": whole.hexdigest(),
           "chunk_bytes": chunk, "parts": parts}
    path = manifest_path(out, src.name)
    path.write_text(json.dumps(man, indent=1) + "\n")
    return path


def read_manifest(dir_or_manifest: str | Path, name: str | None = None) -> tuple[Path, dict]:
    """(folder of the parts, manifest) from a manifest file, or a folder holding exactly one (or `name`'s)."""
    p = Path(dir_or_manifest)
    if p.is_file():
        path = p
    elif p.is_dir():
        found = [manifest_path(p, name)] if name else sorted(p.glob("*.manifest.json"))
        found = [f for f in found if f.is_file()]
        if len(found) != 1:
            what = f"{name}.manifest.json" if name else "*.manifest.json"
            raise DraftGymError(f"carry join: {'no' if not found else len(found)} {what} in {p}"
                                + (" (pass --name)" if len(found) > 1 else ""))
        path = found[0]
    else:
        raise DraftGymError(f"carry join: no such file or folder: {p}")
    try:
        man = json.loads(path.read_text())
        if man.get("format") != FORMAT or not isinstance(man.get("parts"), list):
            raise ValueError(f"not a {FORMAT} manifest")
    except (ValueError, OSError) as e:
        raise DraftGymError(f"carry join: unreadable manifest {path}: {str(e).splitlines()[0]}") from None
    return path.parent, man


def join(dir_or_manifest: str | Path, out: str | Path | None = None, name: str | None = None) -> Path:
    """Put the parts listed in the manifest back together into `out` (default: <dir>/<name>), checking
    each part's size and sha256 before it is used and the whole file's sha256 at the end. On any
    failure nothing is left at `out`. Returns `out`."""
    folder, man = read_manifest(dir_or_manifest, name)
    dest = Path(out) if out is not None else folder / man["name"]
    if dest.is_dir():
        dest = dest / man["name"]
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".joining")
    whole = hashlib.sha256()
    try:
        with open(tmp, "wb") as w:
            for i, part in enumerate(man["parts"]):
                f = folder / part["file"]
                if not f.is_file():
                    raise DraftGymError(f"carry join: part {i} ({part['file']}) is missing from {folder}; copy it again")
                data = f.read_bytes()
                if len(data) != part["size"] or hashlib.sha256(data).hexdigest() != part["sha256"]:
                    raise DraftGymError(f"carry join: part {i} ({part['file']}) is corrupted "
                                        f"({len(data)} of {part['size']} bytes, sha256 differs); copy it again")
                whole.update(data)
                w.write(data)
        if whole.hexdigest() != man["sha256"] or tmp.stat().st_size != man["size"]:
            raise DraftGymError(f"carry join: {man['name']} reassembled to the wrong sha256; split it again")
        os.replace(tmp, dest)
    finally:
        if tmp.exists():
            tmp.unlink()
    return dest


def tree_bytes(repo: str | Path = ".") -> int:
    """Bytes of what travels with every call: tracked files plus untracked files git does not ignore."""
    try:
        r = subprocess.run(["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           capture_output=True, check=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as e:
        raise DraftGymError(f"carry headroom: not a git checkout ({repo}): {str(e).splitlines()[0]}") from None
    root = Path(repo)
    files = {root / n.decode() for n in r.stdout.split(b"\0") if n}
    return sum(f.stat().st_size for f in files if f.is_file())


def headroom(repo: str | Path = ".") -> dict:
    """What is left of one call's 64 MiB after the working tree: the largest part (MiB) to carry."""
    tree = tree_bytes(repo)
    return {"tree_mib": tree / MIB, "limit_mib": TRANSFER_LIMIT / MIB, "headroom_mib": (TRANSFER_LIMIT - tree) / MIB}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.gpu_check.carry", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("split", help="cut FILE into parts under OUT_DIR, with a sha256 manifest")
    s.add_argument("file")
    s.add_argument("out_dir")
    s.add_argument("--chunk-mb", type=float, default=DEFAULT_CHUNK_MB, help="largest part, MiB")
    j = sub.add_parser("join", help="check every part and reassemble the file")
    j.add_argument("dir", help="the folder of the parts (or the manifest file)")
    j.add_argument("--out", default=None, help="the file (or folder) to write; default: DIR/<name>")
    j.add_argument("--name", default=None, help="which file, when DIR holds several manifests")
    sub.add_parser("headroom", help="MiB left for parts in one call after this checkout's working tree")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "split":
            m = split(args.file, args.out_dir, args.chunk_mb)
            man = json.loads(m.read_text())
            print(f"{man['name']}: {len(man['parts'])} parts of <= {man['chunk_bytes'] / MIB:g} MiB -> {m.parent}/")
        elif args.cmd == "join":
            out = join(args.dir, args.out, args.name)
            print(f"joined {out} ({out.stat().st_size} bytes, sha256 checked)")
        else:
            h = headroom()
            print(f"working tree {h['tree_mib']:.1f} MiB of {h['limit_mib']:.0f}: parts up to "
                  f"{h['headroom_mib']:.1f} MiB travel with it")
    except DraftGymError as e:
        print(f"draftgym: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
