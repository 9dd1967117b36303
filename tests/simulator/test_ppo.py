"""simulator/train/ppo.py learns: a contextual bandit whose best action is the sign of the observation is
solved in a few updates, in fp32 and under bf16 autocast (PPOConfig.amp). A sign error in the
surrogate, the advantages or the log-probabilities makes it fail."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from simulator.train.ppo import PPOConfig, ppo_train


class SignBandit:
    """obs x ~ U(-1, 1)^3; reward 1 when the action is [x_0 > 0], else 0; one step per episode."""

    obs_dim, n_actions = 3, 2

    def __init__(self, n):
        self.n, self.rng = n, np.random.default_rng(0)

    def _obs(self):
        self.o = self.rng.uniform(-1, 1, (self.n, 3)).astype(np.float32)
        return self.o

    def reset(self, seed=None):
        self.rng = np.random.default_rng(seed)
        return self._obs(), {}

    def step(self, a):
        r = (np.asarray(a) == (self.o[:, 0] > 0)).astype(np.float64)
        done = np.ones(self.n, bool)
        return self._obs(), r, done, np.zeros(self.n, bool), {}


def _accuracy(actor):
    x = np.random.default_rng(1).uniform(-1, 1, (2000, 3)).astype(np.float32)
    with torch.no_grad():
        a = actor(torch.from_numpy(x)).argmax(-1).numpy()
    return float((a == (x[:, 0] > 0)).mean())


@pytest.mark.parametrize("amp", ["off", "bf16"])
def test_ppo_solves_a_contextual_bandit(amp):
    env = SignBandit(64)
    cfg = PPOConfig(total_steps=64 * 8 * 30, n_envs=64, n_steps=8, minibatch=128, epochs=4, gamma=0.0,
                    actor_hidden=(16,), critic_hidden=(16,), boundary="step", lr=3e-3, ent_coef=0.0,
                    eval_every=0, amp=amp)
    res = ppo_train(env, cfg, progress=False)
    assert {h["amp"] for h in res["history"]} == {amp}
    assert res["history"][-1]["reward"] > 0.8
    assert _accuracy(res["actor"]) > 0.95
    assert next(res["actor"].parameters()).dtype == torch.float32      # the saved policy stays fp32


def test_ppo_amp_is_checked():
    with pytest.raises(ValueError, match="amp"):
        ppo_train(SignBandit(4), PPOConfig(total_steps=32, n_envs=4, amp="fp8"), progress=False)
