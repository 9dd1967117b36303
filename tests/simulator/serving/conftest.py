"""Shared module-scoped fixtures of the serving tests: small synthetic logs with widths 1 and 4 (chains
replay), timed by the gpu profile at B = 1, 2, 4, 8. A test module imports the fixtures it uses;
a module that defines its own `root` gets `logs` and `lat` over that root instead."""
from __future__ import annotations

import pytest

from simulator.latency.model import LatencyModel
from simulator.logs.replay_logs import load_logs
from simulator.logs.synthetic import SyntheticConfig, write_synthetic_logs


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    d = tmp_path_factory.mktemp("serving-logs")
    write_synthetic_logs(d, SyntheticConfig(n_sequences=5, widths=(1, 4), new_tokens=(12, 30), latency_profile="gpu",
                                            latency_batches=(1, 2, 4, 8)))
    return d


@pytest.fixture(scope="module")
def logs(root):
    return load_logs(root, widths="all", split="all")


@pytest.fixture(scope="module")
def lat(root):
    return LatencyModel.from_logs(root)
