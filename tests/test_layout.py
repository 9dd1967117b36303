"""The house rules (docs/design.md): imports flow online -> simulator -> pipeline (the tools above them,
never imported back), and no module imports itself back through others (no import circle, lazy
function-level imports included: a lazy import that closes a circle is still a circle, only one that
happens to be resolved late); sizes, line length, folder lists, the step shape's one home, module
names, lazy imports. Reads the sources with `ast`; imports none of them. Each check is shown able to fail."""
import ast
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("pipeline", "simulator", "online")
TOOLS = "tools"                 # run from a checkout, not installed; may import the packages, never the reverse
RANK = {"pipeline": 0, "simulator": 1, "online": 2, TOOLS: 3}  # a module may import only from its rank or below


def _imports(path: Path) -> set[str]:
    """Every project module `path` imports, at any nesting level (top-level and lazy)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from simulator import baselines` imports the module simulator.baselines
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        out.update(n for n in names if n.split(".")[0] in RANK)
    return out


def _modules() -> dict[str, Path]:
    """Every module of the three packages and the tools, at any depth (`pipeline/decode/engine/single.py` is
    `pipeline.decode.engine.single`; a package's `__init__.py` is the package itself)."""
    mods = {}
    for p in (*PACKAGES, TOOLS):
        for f in (ROOT / p).rglob("*.py"):
            parts = f.relative_to(ROOT).with_suffix("").parts
            mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return mods


def _resolve(name: str, mods) -> str | None:
    """The module an imported name lands in: `pipeline.decode.engine.single.Engine` -> `pipeline.decode.engine.single`."""
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    g = {}
    for m, f in mods.items():
        deps = {_resolve(i, mods) for i in _imports(f)}
        # a package's own __init__ does not count as a dependency of its members (importing
        # pipeline.decode.engine.single runs pipeline/decode/__init__.py, which imports nothing)
        g[m] = {d for d in deps if d and d != m and not m.startswith(d + ".")}
    return g


def test_every_module_is_seen():
    """The walk goes into subpackages: a module two folders down is in the graph."""
    mods = _modules()
    deep = [m for m in mods if m.count(".") >= 2]
    assert deep, "no module in a subpackage was found"
    assert all(f.exists() for f in mods.values())


def test_no_circles_between_subpackages():
    """Folders import each other in one direction only: the graph of subpackages has no circle.
    A module at a package's top level (`pipeline/errors.py`) is a node of its own."""
    def folder(m):
        return ".".join(m.split(".")[:2])
    fg: dict[str, set[str]] = {}
    for m, deps in _graph().items():
        fg.setdefault(folder(m), set()).update(folder(d) for d in deps if folder(d) != folder(m))
    cycles = _cycles(fg)
    assert not cycles, "circles between subpackages: " + "; ".join(" -> ".join(c) for c in cycles)


def test_imports_flow_online_simulator_pipeline():
    bad = [(m, i) for m, deps in _graph().items() for i in deps
           if RANK[i.split(".")[0]] > RANK[m.split(".")[0]]]
    assert not bad, f"imports against the flow online -> simulator -> pipeline: {bad}"


def _installed_packages(root: Path) -> list[str]:
    """The packages a build installs: setuptools' own discovery with pyproject's include / exclude."""
    import tomllib

    from setuptools import find_packages
    find = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    return find_packages(where=str(root), include=find.get("include", ("*",)), exclude=find.get("exclude", ()))


def _tool_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(package module, tool module) for each import of a tool from inside a package."""
    return sorted((m, i) for m, deps in graph.items() for i in deps
                  if m.split(".")[0] in PACKAGES and i.split(".")[0] == TOOLS)


def test_the_package_holds_no_tools():
    """The tools (the GPU check, the benchmarks) are not installed and nothing installed imports them:
    every package folder is installed, no `tools` module is, no package module imports one, and no
    package holds a `python -m` entry point (`__main__.py`)."""
    installed = _installed_packages(ROOT)
    package_dirs = {".".join(d.relative_to(ROOT).parts) for p in PACKAGES for d in [ROOT / p, *(ROOT / p).rglob("*")]
                    if d.is_dir() and (d / "__init__.py").exists()}
    assert set(installed) == package_dirs, set(installed) ^ package_dirs
    assert not _tool_imports(_graph()), _tool_imports(_graph())
    assert not [f for p in PACKAGES for f in (ROOT / p).rglob("__main__.py")], "a tool's entry point inside a package"


def test_the_tools_check_can_fail(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.setuptools.packages.find]\ninclude = ["pipeline*", "tools*"]\n')
    for d in ("pipeline", "tools"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "__init__.py").write_text("")
    assert sorted(_installed_packages(tmp_path)) == ["pipeline", "tools"]
    assert _tool_imports({"online.cli": {"tools.bench", "pipeline.metrics"}, "tools.bench": {"online.cli"}}) == \
        [("online.cli", "tools.bench")]


def _cycles(g: dict[str, set[str]]) -> list[list[str]]:
    state, stack, cycles = {}, [], []

    def visit(m):                       # depth-first search; a grey node met again closes a circle
        state[m] = "grey"
        stack.append(m)
        for d in sorted(g.get(m, ())):
            if state.get(d) == "grey":
                cycles.append(stack[stack.index(d):] + [d])
            elif d not in state:
                visit(d)
        stack.pop()
        state[m] = "black"

    for m in sorted(g):
        if m not in state:
            visit(m)
    return cycles


def test_no_import_circles():
    cycles = _cycles(_graph())
    assert not cycles, "import circles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_the_checker_sees_a_circle(tmp_path):
    """The checker itself can fail: a lazy import back is found."""
    (tmp_path / "a.py").write_text("def f():\n    from simulator import b\n")
    assert "simulator.b" in _imports(tmp_path / "a.py")


def test_the_checker_sees_a_circle_between_folders():
    g = {"pipeline.decode": {"pipeline.logs"}, "pipeline.logs": {"pipeline.decode"}}
    assert _cycles(g)


MAX_LINES, MAX_MODULES = 400, 12      # a module reads in one sitting; a folder's list fits its __init__ docstring
# one concept that needs more says so in its docstring ("Over 400 lines: <why>"), up to HARD_MAX_LINES,
# rather than squeezing help texts or splitting the concept across files
HARD_MAX_LINES, OVER_REASON = 600, "Over 400 lines:"


def _says_why_it_is_long(f: Path) -> bool:
    doc = ast.get_docstring(ast.parse(f.read_text(), str(f))) or ""
    return OVER_REASON in " ".join(doc.split())


def _oversized(root: Path) -> list[str]:
    """Modules over MAX_LINES lines (unless their docstring gives the reason; never over HARD_MAX_LINES)
    and folders over MAX_MODULES modules (.py files, __init__ included) under root's packages, tools and tests/."""
    out = []
    for top in (*PACKAGES, TOOLS, "tests"):
        for d in [root / top, *(p for p in (root / top).rglob("*") if p.is_dir() and p.name != "__pycache__")]:
            files = sorted(d.glob("*.py"))
            if len(files) > MAX_MODULES:
                out.append(f"{d.relative_to(root)}/: {len(files)} modules")
            out += [f"{f.relative_to(root)}: {n} lines" for f in files
                    if (n := len(f.read_text().splitlines())) > HARD_MAX_LINES
                    or (n > MAX_LINES and not _says_why_it_is_long(f))]
    return out


def test_modules_and_folders_stay_small():
    """No module over 400 lines, no folder over 12 modules (docs/design.md, the layout table)."""
    too_big = _oversized(ROOT)
    assert not too_big, too_big


def test_the_size_check_can_fail(tmp_path):
    (tmp_path / "pipeline" / "x").mkdir(parents=True)
    for i in range(MAX_MODULES + 1):
        (tmp_path / "pipeline" / "x" / f"m{i}.py").write_text("")
    (tmp_path / "pipeline" / "long.py").write_text("\n" * (MAX_LINES + 1))
    (tmp_path / "pipeline" / "said.py").write_text('"""One concept.\n\nOver 400 lines: the\nreason."""' + "\n" * MAX_LINES)
    (tmp_path / "pipeline" / "huge.py").write_text('"""Over 400 lines: a reason."""' + "\n" * (HARD_MAX_LINES + 1))
    assert _oversized(tmp_path) == ["pipeline/huge.py: 601 lines", "pipeline/long.py: 401 lines", "pipeline/x/: 13 modules"]


# -- one home for the step shape; real module names ---------------------------------------------------

SHAPE_HOME = "pipeline/decode/step_shape.py"
SHAPE_NAMES = {"StepShape", "pool_size", "canonical", "chain_k", "is_chain", "CHAIN_KS"}
# "W + (D - 1) * W * W" however spelled: "+ (<depth> - 1) * <width> * <width>" or "... * <width> ** 2"
POOL_FORMULA = re.compile(r"\+ \((?:int\()?[\w.\[\]]+\)? - 1\) \* [\w.\[\]]+ (?:\* [\w.\[\]]+|\*\* 2)")


def _shape_definitions(files) -> dict[str, list[str]]:
    """{name: files defining it} for the step shape's names (a def, a class or a module-level assignment)."""
    out = {}
    for f in files:
        for node in ast.parse(f.read_text(), str(f)).body:
            names = [node.name] if isinstance(node, (ast.FunctionDef, ast.ClassDef)) else \
                [t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)]
            for n in names:
                if n in SHAPE_NAMES:
                    out.setdefault(n, []).append(str(f.relative_to(ROOT)))
    return out


def test_the_step_shape_has_one_home():
    """StepShape, the pool size and the shape helpers are defined once, in pipeline/decode/step_shape.py,
    and the pool's formula W + (D - 1) W^2 is written nowhere else in code."""
    files = [f for p in PACKAGES for f in (ROOT / p).rglob("*.py")]
    defs = _shape_definitions(files)
    assert defs == {n: [SHAPE_HOME] for n in SHAPE_NAMES}, defs
    formula = []
    for f in files:
        if str(f.relative_to(ROOT)) == SHAPE_HOME:
            continue
        for i, line in enumerate(f.read_text().splitlines(), 1):
            if POOL_FORMULA.search(line.split("#")[0]):
                formula.append(f"{f.relative_to(ROOT)}:{i}")
    assert not formula, formula


def _one_letter_aliases(files) -> list[str]:
    """`import x.y as Z` / `from x import y as Z` with a one-letter alias; torch.nn.functional
    as F is PyTorch's own convention and allowed."""
    out = []
    for f in files:
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for a in node.names:
                    full = f"{getattr(node, 'module', None) or ''}.{a.name}".strip(".")
                    if a.asname and len(a.asname) == 1 and full != "torch.nn.functional":
                        out.append(f"{f.relative_to(ROOT)}: {full} as {a.asname}")
    return out


def test_modules_are_imported_by_their_names():
    files = [f for p in (*PACKAGES, TOOLS, "tests") for f in (ROOT / p).rglob("*.py")]
    assert not _one_letter_aliases(files), _one_letter_aliases(files)


@pytest.fixture
def at_tmp_root(tmp_path, monkeypatch):
    """The checks name files relative to tmp_path (where a can-fail test writes its own), not the repository."""
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    return tmp_path


def test_the_shape_and_alias_checks_can_fail(at_tmp_root):
    (at_tmp_root / "a.py").write_text("from simulator.serving import shapes as S\nimport torch.nn.functional as F\n")
    (at_tmp_root / "b.py").write_text("def pool_size(d, w):\n    return d\n")
    assert _one_letter_aliases([at_tmp_root / "a.py"]) == ["a.py: simulator.serving.shapes as S"]
    assert _shape_definitions([at_tmp_root / "b.py"]) == {"pool_size": ["b.py"]}
    assert POOL_FORMULA.search("n = w + (d - 1) * w * w") and POOL_FORMULA.search("W + (int(depth) - 1) * W ** 2")
    assert not POOL_FORMULA.search("KVBuffer(kv, B, (max_depth - 1) * W)")


# -- each folder lists what it holds ---------------------------------------------------------------------

def _unlisted(root: Path) -> list[str]:
    """Modules and subpackages a package's `__init__.py` docstring does not name (`x.py` or `x/`)."""
    out = []
    for top in (*PACKAGES, TOOLS):
        for init in (root / top).rglob("__init__.py"):
            doc, d = ast.get_docstring(ast.parse(init.read_text(), str(init))) or "", init.parent
            names = [f.name for f in d.glob("*.py") if f.name != "__init__.py"] + \
                [s.name + "/" for s in d.iterdir() if (s / "__init__.py").exists()]
            out += [f"{d.relative_to(root)}/: {n}" for n in sorted(names)
                    if not re.search(rf"(?<![\w.]){re.escape(n)}", doc)]        # "run.py" is not "prerun.py"
    return out


def test_every_folder_lists_its_modules():
    """README: each folder's `__init__.py` lists its modules; a module added without a line there is found."""
    assert not _unlisted(ROOT), _unlisted(ROOT)


def test_the_listing_check_can_fail(tmp_path):
    (tmp_path / "pipeline" / "sub").mkdir(parents=True)
    (tmp_path / "pipeline" / "__init__.py").write_text('"""The package.\n\n    a.py   listed\n"""\n')
    (tmp_path / "pipeline" / "sub" / "__init__.py").write_text('"""Listed: x.py and prerun.py."""\n')
    for f in ("a.py", "b.py", "sub/x.py", "sub/run.py"):
        (tmp_path / "pipeline" / f).write_text("")
    (tmp_path / TOOLS).mkdir()
    assert _unlisted(tmp_path) == ["pipeline/: b.py", "pipeline/: sub/", "pipeline/sub/: run.py"]


# -- imports at the top unless a lazy one has a reason -------------------------------------------------------

FREE = set(sys.stdlib_module_names) | {"numpy"}     # cost nothing worth deferring: never a reason to import late


def _needless_lazy_imports(files) -> list[str]:
    """Function-level imports of the standard library or numpy: a lazy import is for start-up time
    (`draftgym --help` imports no torch) or an optional dependency, which these never are."""
    out = []
    for f in files:
        for fn in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(fn):
                    if isinstance(node, (ast.Import, ast.ImportFrom)) and getattr(node, "level", 0) == 0:
                        names = [node.module] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                        if any(n.split(".")[0] in FREE for n in names):
                            out.append(f"{f.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    return out


def test_no_needless_lazy_imports():
    files = [f for p in (*PACKAGES, TOOLS) for f in (ROOT / p).rglob("*.py")]
    assert not _needless_lazy_imports(files), _needless_lazy_imports(files)


def test_the_lazy_import_check_can_fail(at_tmp_root):
    (at_tmp_root / "a.py").write_text("import json\n\ndef f():\n    import torch\n    import re\n    from numpy import ones\n")
    assert _needless_lazy_imports([at_tmp_root / "a.py"]) == ["a.py:5: import re", "a.py:6: from numpy import ones"]


# -- a line reads without scrolling -----------------------------------------------------------------------

MAX_LINE = 140          # the lint's line length: long help texts are split, not squeezed onto one line


def _long_lines(files) -> list[str]:
    return [f"{f.relative_to(ROOT)}:{i}: {len(line)}" for f in files
            for i, line in enumerate(f.read_text().splitlines(), 1) if len(line) > MAX_LINE]


def test_lines_stay_readable():
    """Every line of Python in the packages, the tools, the tests and the ad-hoc scripts is at most 140 characters."""
    files = [f for p in (*PACKAGES, TOOLS, "tests", "docs/adhoc") for f in (ROOT / p).rglob("*.py")]
    assert not _long_lines(files), _long_lines(files)


def test_the_line_check_can_fail(at_tmp_root):
    (at_tmp_root / "a.py").write_text("x = 1\n" + "y = '" + "z" * MAX_LINE + "'\n")
    assert _long_lines([at_tmp_root / "a.py"]) == [f"a.py:2: {MAX_LINE + 6}"]
