"""notebooks/03_sim_vs_real.ipynb runs on a tiny `draftgym validate` report (collect -> profile -> train -> validate)."""
from __future__ import annotations

from pathlib import Path

import pytest

from online.cli import main as cli
from tests.conftest import build_tiny_logs

ROOT = Path(__file__).resolve().parents[3]
NOTEBOOK = ROOT / "notebooks" / "03_sim_vs_real.ipynb"


def _execute(nbformat, nbclient):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbclient.NotebookClient(nb, kernel_name="python3", timeout=120,
                            resources={"metadata": {"path": str(ROOT / "notebooks")}}).execute()
    return nb


def _outputs(nb) -> str:
    return "".join(o.get("text", "") + o.get("data", {}).get("text/plain", "")
                   for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))


def test_notebook_is_clean():
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in nb.cells if c.cell_type == "code")


def test_notebook_sim_vs_real_on_tiny_report(tmp_path, tiny_model_dir, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    logs, pol, report = build_tiny_logs(tmp_path / "logs", tiny_model_dir, n_prompts=2), tmp_path / "ltd", tmp_path / "report"
    assert cli(["train", "--method", "ltd", "--logs", str(logs), "--model", str(tiny_model_dir), "--out", str(pol),
                "--steps", "2000", "--iters", "0", "--no-progress"]) == 0
    assert cli(["validate", "--model", str(tiny_model_dir), "--head", "random", "--policy", str(pol),
                "--dataset", "mt-bench", "--n-prompts", "2", "--runs", "1", "--max-new-tokens", "16",
                "--logs", str(logs), "--out", str(report), "--json"]) == 0

    monkeypatch.setenv("DRAFTGYM_REPORT", str(report))
    monkeypatch.setenv("DRAFTGYM_LOGS", str(logs))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    nb = _execute(nbformat, nbclient)
    text = _outputs(nb)
    assert f"report {report}" in text and "latency profile" in text
    assert "cycles: {('mt-bench', 'grid-best')" in text and "('mt-bench', 'ltd')" in text, text
    assert "verify, measured / predicted over all" in text
    assert "implied calls/cycle" in text and "dominant" in text
    images = sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert images >= 4, text


def test_notebook_sim_vs_real_without_report(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    monkeypatch.setenv("DRAFTGYM_REPORT", str(tmp_path / "no-report"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    with pytest.raises(nbclient.exceptions.CellExecutionError, match="make demo"):
        _execute(nbformat, nbclient)
