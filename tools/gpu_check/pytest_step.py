"""The GPU check's tests step: `pytest -m gpu` on the device, in a subprocess inside the step's share of the budget.

Only the test files that hold `gpu`-marked tests are collected (others may import packages the GPU
machines lack); DRAFTGYM_TEST_DEVICE tells tests/online/test_on_device.py which device to use. The
dry run only collects them. pytest's output goes to tests.log.
"""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import time
from pathlib import Path

TEST_DEVICE_ENV = "DRAFTGYM_TEST_DEVICE"       # read by tests/online/test_on_device.py
ROOT = Path(__file__).resolve().parents[2]


def gpu_test_files() -> list[str]:
    """The test files that hold `gpu`-marked tests (only these are collected: others may import
    packages the GPU machine lacks)."""
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py")
                  if "mark.gpu" in p.read_text())


def pytest_counts(text: str) -> dict:
    """{'passed': 7, 'failed': 1, ...} from pytest's closing line (or 'collected' with --collect-only)."""
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected|xfailed|xpassed)", text)}
    m = re.search(r"(\d+)(?:/\d+)? tests? collected", text)
    if m:
        counts["collected"] = int(m.group(1))
    return counts


def run_tests(cfg, deadline: float, out: Path) -> dict:
    if importlib.util.find_spec("pytest") is None:
        return {"status": "skipped", "reason": "pytest is not installed here (carry its wheel: docs/gpu.md)"}
    files = gpu_test_files()
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", *files]
    cmd += ["--collect-only"] if cfg.dry_run else []
    env = {**os.environ, TEST_DEVICE_ENV: cfg.device, "PYTHONUNBUFFERED": "1"}
    timeout = max(1.0, deadline - time.perf_counter())
    try:
        r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        text, rc = r.stdout + r.stderr, r.returncode
    except subprocess.TimeoutExpired as e:
        text, rc = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or ""), None
    (out / "tests.log").write_text(f"$ {' '.join(cmd)}\n{TEST_DEVICE_ENV}={cfg.device}\n\n{text}")
    counts = pytest_counts(text.strip().splitlines()[-1] if text.strip() else "")
    res = {"files": files, "device": cfg.device, "collect_only": cfg.dry_run, "counts": counts, "returncode": rc}
    if rc is None:
        return {**res, "status": "failed", "reason": f"pytest ran past its {timeout:.0f} s share of the budget"}
    return {**res, "status": "ok" if rc == 0 else "failed", "reason": None if rc == 0 else f"pytest exit {rc}"}
