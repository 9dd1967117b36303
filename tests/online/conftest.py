"""Shared fixtures of the online tests: the tiny target's logs and batched profile that validate's
batch-size and load-trace modes and the learned chooser's adapter replay against."""
from __future__ import annotations

import pytest

from online.cli import main as cli


@pytest.fixture(scope="module")
def batch_logs(tmp_path_factory, tiny_model_dir):
    """MT-bench test-split logs of the tiny target at widths 1 and 10 (chains replay) and a latency
    profile at B = 1, 2 (the closed-batch replay needs a batched profile)."""
    from pipeline.collect.job import run_collect
    from pipeline.collect.prompt import CollectConfig

    logs = tmp_path_factory.mktemp("batch-logs")
    run_collect(CollectConfig(model=str(tiny_model_dir), head="random", dataset="mt-bench", split="test", n_prompts=3,
                              max_new_tokens=12, widths=(1, 10), max_depth=8), logs, use_ray=False, progress=False)
    assert cli(["profile", "--model", str(tiny_model_dir), "--head", "random", "--verify-sizes", "1,3,5,60",
                "--widths", "1,10", "--contexts", "64", "--repeats", "2", "--batch-sizes", "1,2", "--out", str(logs),
                "--no-progress"]) == 0
    return logs
