"""The package layout the README promises: imports flow online -> simulator -> pipeline, and no
module imports itself back through others (no import circle, lazy function-level imports included:
a lazy import that closes a circle is still a circle, only one that happens to be resolved late).
Reads the sources with `ast`; imports nothing."""
import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("pipeline", "simulator", "online")
RANK = {"pipeline": 0, "simulator": 1, "online": 2}     # a module may import only from its rank or below


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
        out.update(n for n in names if n.split(".")[0] in PACKAGES)
    return out


def _modules() -> dict[str, Path]:
    """Every module of the three packages, at any depth (`pipeline/decode/engine/single.py` is
    `pipeline.decode.engine.single`; a package's `__init__.py` is the package itself)."""
    mods = {}
    for p in PACKAGES:
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


def _oversized(root: Path) -> list[str]:
    """Modules over MAX_LINES lines and folders over MAX_MODULES modules (.py files, __init__ included)
    under root's packages and tests/."""
    out = []
    for top in (*PACKAGES, "tests"):
        for d in [root / top, *(p for p in (root / top).rglob("*") if p.is_dir() and p.name != "__pycache__")]:
            files = sorted(d.glob("*.py"))
            if len(files) > MAX_MODULES:
                out.append(f"{d.relative_to(root)}/: {len(files)} modules")
            out += [f"{f.relative_to(root)}: {n} lines" for f in files
                    if (n := len(f.read_text().splitlines())) > MAX_LINES]
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
    assert _oversized(tmp_path) == ["pipeline/long.py: 401 lines", "pipeline/x/: 13 modules"]


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
    files = [f for p in (*PACKAGES, "tests") for f in (ROOT / p).rglob("*.py")]
    assert not _one_letter_aliases(files), _one_letter_aliases(files)


def test_the_shape_and_alias_checks_can_fail(tmp_path):
    (tmp_path / "a.py").write_text("from simulator.serving import shapes as S\nimport torch.nn.functional as F\n")
    (tmp_path / "b.py").write_text("def pool_size(d, w):\n    return d\n")
    global ROOT
    root, ROOT = ROOT, tmp_path
    try:
        assert _one_letter_aliases([tmp_path / "a.py"]) == ["a.py: simulator.serving.shapes as S"]
        assert _shape_definitions([tmp_path / "b.py"]) == {"pool_size": ["b.py"]}
        assert POOL_FORMULA.search("n = w + (d - 1) * w * w") and POOL_FORMULA.search("W + (int(depth) - 1) * W ** 2")
        assert not POOL_FORMULA.search("KVBuffer(kv, B, (max_depth - 1) * W)")
    finally:
        ROOT = root
