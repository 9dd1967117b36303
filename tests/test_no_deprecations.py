"""No FutureWarning, and no DeprecationWarning from transformers, in any command's output.

Each command runs in a fresh interpreter with every such warning shown on every call
(PYTHONWARNINGS=always: pytest's own filters, which ignore DeprecationWarning, do not apply there),
so a deprecated call anywhere on its path, imports included, lands in its stderr. transformers
raises its deprecations (`deprecate_kwarg`) as FutureWarning, named after the caller's file."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONWARNINGS": "always::FutureWarning,always::DeprecationWarning"}


def run_python(code: str, *argv: str) -> str:
    """Run `python -c code argv...` from the repository root; returns stdout + stderr (it must exit 0)."""
    p = subprocess.run([sys.executable, "-c", code, *argv], cwd=ROOT, env=ENV, capture_output=True, text=True,
                       timeout=900)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    return p.stdout + p.stderr


def run_cli(*argv: str) -> str:
    return run_python("import sys; from online.cli import main; sys.exit(main())", *argv)


def deprecations(output: str) -> list[str]:
    """The warning lines that matter: every FutureWarning, and each DeprecationWarning raised inside
    transformers or on the way through this repository's code."""
    warned = [ln for ln in output.splitlines() if re.search(r"\b(FutureWarning|DeprecationWarning): ", ln)]
    ours = ("transformers", f"{os.sep}pipeline{os.sep}", f"{os.sep}simulator{os.sep}", f"{os.sep}online{os.sep}")
    return [ln for ln in warned if "FutureWarning" in ln or any(s in ln for s in ours)]


FORWARD = """
import sys, torch
from transformers import DynamicCache
from tests.conftest import make_tiny_llama
m = make_tiny_llama()
ids = torch.tensor([[1, 2, 3]])
m(input_ids=ids, use_cache=True, **{sys.argv[1]: DynamicCache(config=m.config)})
"""


def test_the_check_catches_the_old_cache_argument():
    """The check can fail: the pre-5.24 argument name warns, the one the pipeline passes does not."""
    old = deprecations(run_python(FORWARD, "past_key_values"))
    assert old and all("past_key_values" in ln for ln in old), old
    assert deprecations(run_python(FORWARD, "cache")) == []


def test_generate_collect_validate_print_no_deprecation(tmp_path, tiny_model_dir):
    model = str(tiny_model_dir)
    out = run_cli("generate", "--model", model, "--head", "random", "--prompt", "Hi", "--max-new-tokens", "8",
                  "--depth", "3", "--width", "2", "--verify-size", "4", "--json")
    assert deprecations(out) == [], out
    out = run_cli("collect", "--model", model, "--head", "random", "--n-prompts", "1", "--max-new-tokens", "8",
                  "--max-depth", "3", "--widths", "2", "--no-ray", "--no-progress", "--out", str(tmp_path / "logs"))
    assert "collected 1 prompts" in out and deprecations(out) == [], out
    out = run_cli("validate", "--model", model, "--head", "random", "--policy", "ddd", "--n-prompts", "1",
                  "--runs", "1", "--max-new-tokens", "8", "--logs", "", "--out", str(tmp_path / "report"),
                  "--no-progress")
    assert (tmp_path / "report" / "report.md").is_file() and deprecations(out) == [], out
