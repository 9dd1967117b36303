"""Every relative link in the README, BENCHMARKS.md and docs/ points at a file that exists, and every
#anchor into a Markdown file names one of its headings (GitHub's slug rule)."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
REFERENCE = re.compile(r"^\[[^\]]+\]:\s+(\S+)", re.M)      # reference-style definitions: [N3]: docs/...#n3


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation except - and _ dropped, spaces -> '-'."""
    h = re.sub(r"[^\w\- ]", "", heading.strip().lstrip("#").strip().lower())
    return h.replace(" ", "-")


def broken_links(files) -> list[str]:
    bad = []
    for f in files:
        text = re.sub(r"```.*?```", "", f.read_text(), flags=re.S)      # links inside code blocks are examples
        for target in LINK.findall(text) + REFERENCE.findall(text):
            if re.match(r"^[a-z]+:", target):                           # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = (f.parent / path).resolve() if path else f
            if not dest.exists():
                bad.append(f"{f.relative_to(ROOT)}: missing {target}")
            elif anchor and dest.suffix == ".md":
                if anchor not in {slug(l) for l in dest.read_text().splitlines() if l.startswith("#")}:
                    bad.append(f"{f.relative_to(ROOT)}: no heading for #{anchor} in {path or f.name}")
    return bad


def test_docs_links_resolve():
    files = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").rglob("*.md"))]
    assert not broken_links(files), "\n".join(broken_links(files))


def test_the_checker_sees_a_broken_link(tmp_path):
    global ROOT
    (tmp_path / "a.md").write_text("# Title\n[ok](a.md#title) [gone](b.md) [anchor](a.md#nope) [ref]\n\n[ref]: c.md\n")
    old, ROOT = ROOT, tmp_path
    try:
        bad = broken_links([tmp_path / "a.md"])
    finally:
        ROOT = old
    assert bad == ["a.md: missing b.md", "a.md: no heading for #nope in a.md", "a.md: missing c.md"]
