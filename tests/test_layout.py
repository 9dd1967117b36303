"""The package layout the README promises: imports flow online -> simulator -> pipeline, and no
module imports itself back through others (no import circle, lazy function-level imports included:
a lazy import that closes a circle is still a circle, only one that happens to be resolved late).
Reads the sources with `ast`; imports nothing."""
import ast
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


def _graph() -> dict[str, set[str]]:
    mods = {f"{p}.{f.stem}": f for p in PACKAGES for f in (ROOT / p).glob("*.py") if f.stem != "__init__"}
    return {m: {i for i in _imports(f) if i in mods and i != m} for m, f in mods.items()}


def test_imports_flow_online_simulator_pipeline():
    bad = [(m, i) for m, deps in _graph().items() for i in deps
           if RANK[i.split(".")[0]] > RANK[m.split(".")[0]]]
    assert not bad, f"imports against the flow online -> simulator -> pipeline: {bad}"


def test_no_import_circles():
    g = _graph()
    state, stack, cycles = {}, [], []

    def visit(m):                       # depth-first search; a grey node met again closes a circle
        state[m] = "grey"
        stack.append(m)
        for d in sorted(g[m]):
            if state.get(d) == "grey":
                cycles.append(stack[stack.index(d):] + [d])
            elif d not in state:
                visit(d)
        stack.pop()
        state[m] = "black"

    for m in sorted(g):
        if m not in state:
            visit(m)
    assert not cycles, "import circles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_the_checker_sees_a_circle(tmp_path):
    """The checker itself can fail: a lazy import back is found."""
    (tmp_path / "a.py").write_text("def f():\n    from simulator import b\n")
    assert "simulator.b" in _imports(tmp_path / "a.py")
