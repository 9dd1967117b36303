"""docs/adhoc: every measurement script imports without side effects (its work runs in `main(argv)`),
answers --help, and is listed in docs/adhoc/README.md; the cheap ones run on tiny inputs (synthetic
logs, a hand-made report, two KV-write cases). A stale import or call in a script fails here."""
from __future__ import annotations

import importlib.util
import json
import re
import shutil
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
ADHOC = ROOT / "docs" / "adhoc"
SCRIPTS = sorted(ADHOC.glob("*.py"))


def load(name: str):
    """docs/adhoc/<name>.py as a fresh module (the repository root on sys.path, as the scripts run)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    spec = importlib.util.spec_from_file_location(f"adhoc_{name}", ADHOC / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_there_are_scripts():
    assert len(SCRIPTS) >= 10


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.stem)
def test_imports_without_side_effects(path, capsys):
    mod = load(path.stem)
    assert callable(getattr(mod, "main", None)), f"{path.name} has no main(argv)"
    assert mod.__doc__ and mod.__doc__.strip(), f"{path.name} has no docstring (its usage)"
    out = capsys.readouterr()
    assert out.out == "", f"importing {path.name} printed: {out.out[:200]}"


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.stem)
def test_help(path, capsys):
    with pytest.raises(SystemExit) as e:
        load(path.stem).main(["--help"])
    assert e.value.code == 0
    assert "usage:" in capsys.readouterr().out


def test_readme_lists_every_script():
    """The README's table names exactly the scripts here."""
    text = (ADHOC / "README.md").read_text()
    table = set(re.findall(r"^\| `([\w.]+\.py)", text, flags=re.M))
    assert table == {p.name for p in SCRIPTS}


def test_report_table(tmp_path, capsys):
    rep = {"config": {"runs": 3},
           "datasets": {"mt-bench": {
               "grid_best": [3, 10, 8], "lossless": True,
               "methods": {"ar": {"tokens_per_s": 10.0, "tokens_per_s_std": 0.1, "speedup_vs_ar": 1.0,
                                  "speedup_vs_grid-best": 0.8, "tau": None, "controller_share": 0.0},
                           "ltd": {"tokens_per_s": 15.0, "tokens_per_s_std": 0.5, "speedup_vs_ar": 1.5,
                                   "speedup_vs_grid-best": None, "tau": 2.5, "controller_share": 0.012}},
               "sim_vs_real": {"ar": {"tokens_per_s_rel_error": 0.03},
                               "methods": {"ltd": {"tau_rel_error": -0.01, "tokens_per_s_rel_error": 0.05}}}}}}
    path = tmp_path / "report.json"
    path.write_text(json.dumps(rep))
    load("report_table").main([str(path)])
    out = capsys.readouterr().out
    assert "mt-bench (grid-best (3, 10, 8); lossless yes):" in out
    assert "| ar | 10.00 ± 0.10 | 1.000 | 0.800 | - | 0.00 | - | +3.0% |" in out
    assert "| ltd | 15.00 ± 0.50 | 1.500 | - | 2.50 | 1.20 | -1.0% | +5.0% |" in out


def test_policy_sweep_selects_each_groups_best_seed(tmp_path, capsys):
    """Runs already in OUT are read, not retrained: no subprocess, the best val per group selected."""
    out = tmp_path / "sweep"
    for seed, val in ((0, 11.0), (1, 12.5)):
        d = out / f"ltd-paper-rate-s{seed}"
        d.mkdir(parents=True)
        (d / "training.json").write_text(json.dumps({"val_tokens_per_s": val, "wall_s": 3.0,
                                                     "config": {"rate_ref": 1.0}, "reference": {}}))
    sweep = load("policy_sweep").main(["unused-logs", str(out), "ltd", "paper", "rate", "0,1"])
    assert [r["seed"] for r in sweep["selected"]] == [1]
    assert json.loads((out / "sweep.json").read_text())["selected"][0]["val"] == 12.5
    assert "* ltd-paper-rate-s1" in capsys.readouterr().out


def test_kv_write_micro_tiny(capsys):
    load("kv_write_micro").main(["--cases", "1x1,2x3", "--forwards", "2", "--repeats", "1"])
    rows = [ln for ln in capsys.readouterr().out.splitlines() if re.match(r"\| \d+ \| \d+ \|", ln)]
    assert len(rows) == 2


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="no oneDNN in this torch build")
def test_linear_backends_matmul_tiny(capsys):
    load("linear_backends_matmul").main(["--shapes", "48x32", "--rows", "1,3", "--n", "2"])
    out = capsys.readouterr().out
    assert out.count("W[48,32]") == 2 and "packed" in out


def test_one_engine_cpu_refuses_an_unknown_method(capsys):
    with pytest.raises(SystemExit) as e:                  # before any model is loaded
        load("one_engine_cpu").main(["float32", "1", "2", "1", "ar,bogus"])
    assert e.value.code == 2
    assert "bogus" in capsys.readouterr().err


# -- the replay-side scripts on synthetic logs (widths 10, the cpu profile at B = 1, 2, 4) ---------

@pytest.fixture(scope="module")
def syn_logs(tmp_path_factory):
    from simulator.logs.synthetic import SyntheticConfig, write_synthetic_logs

    root = tmp_path_factory.mktemp("adhoc-logs")
    write_synthetic_logs(root, SyntheticConfig(n_sequences=5, new_tokens=(20, 40), latency_batches=(1, 2, 4)))
    return root


def test_confidence_signal(syn_logs, capsys):
    load("confidence_signal").main([str(syn_logs)])
    out = capsys.readouterr().out
    assert "grid-best (per-cycle form)" in out and "ridge on all" in out and "R^2 of L" in out


def test_tune_task_memory(syn_logs, tmp_path):
    logs = tmp_path / "logs"
    shutil.copytree(syn_logs, logs)
    shutil.copytree(syn_logs, logs / "_bench_tune")           # the profile the scale bench writes there
    res = load("tune_task_memory").main([str(logs), "1000"])
    assert res["positions"] > 0 and res["sequences"] > 0


def test_batch_steps_vs_model(syn_logs, tmp_path, capsys):
    from pipeline.logs.schema import write_batch_steps

    rows = [{"method": "static", "run": 0, "step": i, "batch": 2, "queue": 0, "depth": 2, "width": 10,
             "verify_size": 8, "context_mean": 100.0 + i, "context_max": 110 + i, "prompt_ids": ["a", "b"],
             "accepted": [1, 2], "emitted_sum": 5, "t_draft": 0.004, "t_verify": 0.02, "t_controller": 0.0,
             "t_step": 0.03} for i in range(3)]
    write_batch_steps(tmp_path, "synthetic-llm", "mt-bench", 0.0, "run-B2", rows)
    load("batch_steps_vs_model").main([str(tmp_path), str(syn_logs)])
    out = capsys.readouterr().out
    assert re.search(r"B= 2 static\s+tree  n=  3 .* step\s+30\.0/", out), out


def test_house_tree(tmp_path, capsys):
    """The working tree's folders and import graph: the engine's folder, the tools, and the flow
    online -> simulator -> pipeline (no edge from a lower package to a higher one)."""
    assert load("house_tree").main(["--worktree", "--out", str(tmp_path / "tree.md")]) == 0
    md = (tmp_path / "tree.md").read_text()
    assert "| `pipeline/decode/engine/` |" in md and "| `tools/gpu_check/` |" in md and md == capsys.readouterr().out[:-1]
    with pytest.raises(SystemExit, match="'no-such-rev' is not a revision"):       # a bad revision: one line
        load("house_tree").main(["no-such-rev"])
    edges = re.findall(r"^- `(\w+)\.[\w.]*` -> (.*)$", md, re.M)
    rank = {"pipeline": 0, "simulator": 1, "online": 2, "tools": 3}
    assert edges and all(rank[b] <= rank[a] for a, targets in edges for b in re.findall(r"`(\w+)", targets))
