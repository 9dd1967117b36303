"""RADAR (arXiv:2512.14069): an LSTM stop/continue policy trained offline with REINFORCE.

Model: LSTM(W=10 -> 128) over the per-call beam confidences (`radar_obs`), then an MLP over
[h_t, x_t] (138 -> 128 -> 2); at most 8 draft calls, W = 10, V = 60.
Data: RADAR's dataset is one draft phase per prefix. Here a batch is 64 positions drawn
uniformly from the training split (RadarEnv with one-cycle episodes), replayed exactly; the
reward is -alpha per CONTINUE and (L+1)/T_gen(t) at the stop (`EnvConfig.radar_*`; L/T_gen with
count_bonus=False, E[L] from the logged distributions with reward="expected" at T > 0).
Loss (REINFORCE, no baseline, as the paper; `baseline="mean"` subtracts the batch mean return):

    J = - mean_b sum_t log pi(a_t | s_1..t) G_t,        G_t = sum_{k >= t} r_k

Adam (lr 1e-3), batch 64. The paper runs 100 epochs; here the budget is `steps` gradient steps
(one "epoch" = n_train_positions / 64 steps), the best validation checkpoint is kept.
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass, replace

import numpy as np

from simulator.observations import paper as obs
from simulator.observations import rich
from simulator.envs.vector import make_replay_env
from simulator.methods.checkpoint import save_policy
from simulator.policies.nets import make_radar_net
from simulator.methods.radar.policy import RadarPolicy
from simulator.train.common import (PolicyTrainConfig, TrainData, TrainMethod, replay_tokens_per_s, window_starts,
                                    resolve_rate_ref, resolve_verify_size)


@dataclass
class RadarConfig:
    width: int = 10
    verify_size: int = 60
    max_calls: int = obs.RADAR_MAX_CALLS
    hidden: int = 128
    mlp_hidden: int = 128
    batch: int = 64
    steps: int = 3000                  # gradient steps (paper: 100 epochs)
    lr: float = 1e-3
    alpha: float = 0.0                 # penalty per CONTINUE (tokens/s)
    count_bonus: bool = True
    reward: str = "exact"              # exact | expected
    baseline: str = "none"             # none (RADAR) | mean
    eval_every: int = 250
    obs_variant: str = "paper"         # paper (RADAR's confidences) | rich (observations_rich)
    objective: str = "ratio"           # ratio: (L+1)/T_gen at the stop | rate: (L+1) - rate_ref t_cycle (env_core)
    rate_ref: float = 0.0              # rate: tokens/s to beat (grid-best's on train, resolve_rate_ref)
    seed: int = 0


def train_radar(data: TrainData, cfg: RadarConfig, progress: bool = True) -> dict:
    import torch
    from tqdm import tqdm

    torch.manual_seed(cfg.seed)
    lat = data.latency
    make = lambda logs: make_replay_env(logs, lat, "radar", n_envs=cfg.batch, width=cfg.width, verify_size=cfg.verify_size,
                                        radar_max_calls=cfg.max_calls, radar_alpha=cfg.alpha, radar_count_bonus=cfg.count_bonus,
                                        radar_reward=cfg.reward, episode_cycles=1, autoreset=False, seed=cfg.seed,
                                        obs_variant=cfg.obs_variant, objective=cfg.objective, rate_ref=cfg.rate_ref)
    env = make(data.train)
    refill = window_starts(cfg.steps) if data.refill is not None else {}   # large logs: a new window per part
    net = make_radar_net(env.obs_dim, cfg.hidden, cfg.mlp_hidden, 2)
    opt = torch.optim.Adam(net.parameters(), lr=cfg.lr)
    rng = np.random.default_rng(cfg.seed)
    history, best_val, best = [], -np.inf, None
    pol = lambda n: RadarPolicy(n, width=cfg.width, verify_size=cfg.verify_size, max_calls=cfg.max_calls,
                                obs_variant=cfg.obs_variant)
    bar = tqdm(range(cfg.steps), desc="RADAR", unit="step", disable=not progress, leave=False)
    t0 = time.perf_counter()
    rets, depths = [], []
    for step in bar:
        if step in refill:                                  # every episode starts at this reset: none is cut
            env = None
            env = make(data.window(refill[step]))
        o, _ = env.reset(seed=int(rng.integers(2**31)))
        state = net.init_state(cfg.batch)
        alive = np.ones(cfg.batch, bool)
        logps, rews, masks = [], [], []
        for _ in range(env.tmax):
            logits, state = net(torch.from_numpy(o), state)
            dist = torch.distributions.Categorical(logits=logits)
            a = dist.sample()
            o, r, term, trunc, _ = env.step(a.numpy())
            logps.append(dist.log_prob(a))
            rews.append(np.where(alive, r, 0.0))
            masks.append(alive.copy())
            alive &= ~(term | trunc)
            if not alive.any():
                break
        R = np.array(rews)                                           # [t, B]
        G = np.flip(np.cumsum(np.flip(R, 0), 0), 0).copy()           # reward-to-go
        if cfg.baseline == "mean":
            G = G - G[0].mean()
        M = torch.from_numpy(np.array(masks, np.float32))
        loss = -(torch.stack(logps) * torch.from_numpy(G.astype(np.float32)) * M).sum(0).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        rets.append(R.sum(0).mean())
        depths.append(np.array(masks).sum(0).mean())
        if (step + 1) % cfg.eval_every == 0 or step == cfg.steps - 1:
            net.eval()
            val = replay_tokens_per_s(pol(net), data.val, lat)
            net.train()
            rec = {"phase": "radar", "steps": (step + 1) * cfg.batch, "reward": float(np.mean(rets)),
                   "mean_calls": float(np.mean(depths)), "val": val, "wall_s": time.perf_counter() - t0}
            history.append(rec)
            rets, depths = [], []
            if val > best_val:
                best_val, best = val, copy.deepcopy(net).eval()
            bar.set_postfix(reward=f"{rec['reward']:.3g}", calls=f"{rec['mean_calls']:.2f}", val=f"{val:.3g}")
    bar.close()
    return {"net": best, "history": history, "val": best_val}


def configure(cfg: PolicyTrainConfig, data: TrainData) -> RadarConfig:
    """RadarConfig for the logs' width and `draftgym train`'s settings (steps: gradient steps, with a
    validation every quarter at most; n_envs: the batch)."""
    c = RadarConfig(width=data.train.width, seed=cfg.seed, obs_variant=cfg.obs)
    c = replace(c, verify_size=resolve_verify_size(cfg, data, c.verify_size), objective=cfg.objective,
                rate_ref=resolve_rate_ref(cfg, data))
    if cfg.steps:
        c = replace(c, steps=cfg.steps, eval_every=max(1, min(c.eval_every, cfg.steps // 4 or 1)))
    if cfg.n_envs:
        c = replace(c, batch=cfg.n_envs)
    return c


def _results(res: dict) -> dict:
    return {"val_tokens_per_s": res["val"]}


def _save(out, res: dict, cfg: RadarConfig, data: TrainData, training: dict) -> None:
    dim = rich.obs_dim("radar", cfg.obs_variant, cfg.width)
    spec = {"type": "radar_lstm", "in": dim, "hidden": cfg.hidden, "mlp_hidden": cfg.mlp_hidden, "out": 2}
    save_policy(out, out.name, "radar", {"radar": {
        "module": res["net"], "net": spec,
        "obs": {"name": "radar", "variant": cfg.obs_variant, "width": cfg.width, "dim": dim},
        "action": {"type": "stop_continue", "max_depth": cfg.max_calls}}},
        {"width": cfg.width, "verify_size": cfg.verify_size, "max_depth": cfg.max_calls},
        training)


METHOD = TrainMethod("RADAR", all_widths=False, configure=configure, train=train_radar, results=_results, save=_save)
