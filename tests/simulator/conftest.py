"""Shared fixtures for the simulator tests: hand-built tiny logs and small synthetic logs."""
from __future__ import annotations

import numpy as np
import pytest

from simulator.logs.synthetic import SyntheticConfig, write_positions, write_sequences, write_synthetic_logs

HAND_MODEL, HAND_DATASET = "tiny", "hand"
HAND_GRID = (1, 10, 60)
HAND_W, HAND_DMAX = 10, 8
# base[p]: L of the deepest tree at V = 60 rooted at p (capped by D); V = 10 accepts base // 2, V = 1 nothing
HAND_SEQS = {
    "A": {"split": "train", "prompt_len": 5, "new_tokens": 12, "base": [3, 1, 2, 0, 0, 5, 2, 2, 4, 1, 1]},
    "B": {"split": "test", "prompt_len": 3, "new_tokens": 6, "base": [0, 4, 1, 1, 0]},
}


def hand_acceptance(base: list[int]) -> np.ndarray:
    D = np.arange(1, HAND_DMAX + 1)[None, :]
    b = np.asarray(base)[:, None]
    acc = np.zeros((len(base), HAND_DMAX, len(HAND_GRID)), np.uint8)
    acc[:, :, 2] = np.minimum(D, b)
    acc[:, :, 1] = np.minimum(D, b // 2)
    return acc


def write_hand_logs(root) -> None:
    rows = []
    for pid, s in HAND_SEQS.items():
        T, P = s["new_tokens"], s["prompt_len"]
        n = T - 1
        rows.append({"prompt_id": pid, "split": s["split"], "prompt_tokens": list(range(P)),
                     "output_tokens": list(range(T + HAND_DMAX)), "new_tokens": T, "widths": [HAND_W],
                     "max_depth": HAND_DMAX, "verify_grid": list(HAND_GRID)})
        beam = np.tile(-np.linspace(0.1, 2.0, HAND_W, dtype=np.float32), (n, HAND_DMAX, 1))
        cand = np.full((n, HAND_DMAX, HAND_W * HAND_W), -3.0, np.float32)
        cand[:, 0, HAND_W:] = np.nan
        ent = np.full((n, HAND_DMAX, HAND_W), 0.5, np.float32)
        ent[:, 0, 1:] = np.nan
        write_positions(root, HAND_MODEL, HAND_DATASET, 0.0, HAND_W, [pid] * n, np.arange(n), P + np.arange(n),
                        hand_acceptance(s["base"]), beam, cand, ent, name=f"hand-{pid}")
    write_sequences(root, HAND_MODEL, HAND_DATASET, 0.0, rows, name="hand")


@pytest.fixture()
def hand_root(tmp_path):
    write_hand_logs(tmp_path)
    return tmp_path


SYN_CFG = SyntheticConfig(n_sequences=5, new_tokens=(16, 36), widths=(8, 10), seed=1)


@pytest.fixture(scope="session")
def syn_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("synlogs")
    write_synthetic_logs(root, SYN_CFG)
    return root


@pytest.fixture(scope="session")
def syn(syn_root):
    from simulator.latency.model import LatencyModel
    from simulator.logs.replay_logs import load_logs

    return load_logs(syn_root, widths="all"), LatencyModel.from_logs(syn_root)
