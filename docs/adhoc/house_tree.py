"""The house's shape at git revisions: each folder's modules and lines, and which folders import which.

    PYTHONPATH=. .venv/bin/python docs/adhoc/house_tree.py a2793aa HEAD [--worktree] [--out FILE.md]

For each revision (`git archive` into a temporary folder; `--worktree`: the working tree as it is), a
table of the folders of pipeline/, simulator/, online/, tools/ and tests/ (modules, lines, the largest
module) and the import graph between folders (`pipeline.decode -> pipeline.models`: a module of the first
imports one of the second, at any nesting level, lazily included), as Markdown; then the edges that
appear or go between the first and the last. The house logs quote it (docs/benchmarks/, "house").
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from tests.test_layout import _imports as file_imports  # noqa: E402 (the house rules' one reading of imports)
TOPS = ("pipeline", "simulator", "online", "tools", "tests")
PACKAGES = ("pipeline", "simulator", "online", "tools")


def checkout(rev: str, into: Path) -> Path:
    """The files of `rev` under `into` (only the folders counted here)."""
    data = subprocess.run(["git", "-C", str(ROOT), "archive", rev, *TOPS], capture_output=True, check=False).stdout
    if not data:                                                  # an old revision without tools/: ask for less
        have = [t for t in TOPS if subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{rev}:{t}"],
                                                  capture_output=True).returncode == 0]
        if not have:
            raise SystemExit(f"house_tree: {rev!r} is not a revision of this repository holding {', '.join(TOPS)}")
        data = subprocess.run(["git", "-C", str(ROOT), "archive", rev, *have], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
    return into


def folders(root: Path) -> list[tuple[str, int, int, str]]:
    """(folder, modules, lines, largest module 'name (lines)') for each folder holding .py files."""
    out = []
    for top in TOPS:
        for d in sorted([root / top, *(p for p in (root / top).rglob("*") if p.is_dir())]):
            files = sorted(d.glob("*.py"))
            if not files or "__pycache__" in d.parts:
                continue
            sizes = {f.name: len(f.read_text().splitlines()) for f in files}
            big = max(sizes, key=sizes.get)
            out.append((str(d.relative_to(root)) + "/", len(files), sum(sizes.values()), f"{big} ({sizes[big]})"))
    return out


def folder_of(module: str) -> str:
    return ".".join(module.split(".")[:2])


def import_graph(root: Path) -> set[tuple[str, str]]:
    """{(folder, folder it imports)} over the packages; a top-level module (`pipeline/metrics.py`) is a folder of its own."""
    mods = {}
    for top in PACKAGES:
        for f in (root / top).rglob("*.py"):
            parts = f.relative_to(root).with_suffix("").parts
            mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    edges = set()
    for m, f in mods.items():
        for n in file_imports(f):                     # the layout test's reading of a file's imports
            while n and n not in mods:
                n = n.rpartition(".")[0]
            if n and folder_of(n) != folder_of(m):
                edges.add((folder_of(m), folder_of(n)))
    return edges


def markdown(label: str, root: Path) -> tuple[str, set]:
    rows = folders(root)
    edges = import_graph(root)
    lines = [f"### {label}", "", "| folder | modules | lines | largest module |", "|---|---|---|---|"]
    lines += [f"| `{d}` | {n} | {l:,} | {big} |" for d, n, l, big in rows]
    pk = [r for r in rows if r[0].split("/")[0] in PACKAGES]
    lines += ["", f"Packages and tools: {sum(r[1] for r in pk)} modules, {sum(r[2] for r in pk):,} lines; tests: "
              f"{sum(r[1] for r in rows if r[0].startswith('tests'))} modules, "
              f"{sum(r[2] for r in rows if r[0].startswith('tests')):,} lines.", "",
              "Import graph between folders (importer -> imported):", ""]
    by = {}
    for a, b in sorted(edges):
        by.setdefault(a, []).append(b)
    lines += [f"- `{a}` -> " + ", ".join(f"`{b}`" for b in bs) for a, bs in by.items()]
    return "\n".join(lines) + "\n", edges


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("revs", nargs="*", help="git revisions (default: none; give --worktree or at least one)")
    ap.add_argument("--worktree", action="store_true", help="also the working tree as it is, last")
    ap.add_argument("--out", help="write the Markdown here too (default: stdout only)")
    args = ap.parse_args(argv)
    if not args.revs and not args.worktree:
        ap.error("give a revision or --worktree")
    parts, graphs = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for rev in args.revs:
            md, edges = markdown(f"at {rev}", checkout(rev, Path(tmp) / rev))
            parts.append(md)
            graphs.append(edges)
        if args.worktree:
            md, edges = markdown("the working tree", ROOT)
            parts.append(md)
            graphs.append(edges)
    if len(graphs) > 1:
        new, gone = graphs[-1] - graphs[0], graphs[0] - graphs[-1]
        parts.append("### Import edges, first against last\n\n" +
                     f"- new: {', '.join(f'`{a}` -> `{b}`' for a, b in sorted(new)) or 'none'}\n" +
                     f"- gone: {', '.join(f'`{a}` -> `{b}`' for a, b in sorted(gone)) or 'none'}\n")
    text = "\n".join(parts)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
