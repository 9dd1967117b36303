"""RADAR (seeds/002, 004): an LSTM stop/continue policy trained offline with REINFORCE.

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
from dataclasses import asdict, dataclass, replace

import numpy as np

from simulator import observations as obs
from simulator import observations_rich as rich
from simulator.env import ReplayEnv
from simulator.checkpoint import save_policy
from simulator.nets import RadarNet
from simulator.policy_radar import RadarPolicy
from simulator.ppo import plot_history
from simulator.train_common import TrainData, finish, load_training_data, logs_info, reference_speeds, \
    replay_tokens_per_s, resolve_rate_ref, resolve_verify_size


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
    env = ReplayEnv(data.train, lat, "radar", n_envs=cfg.batch, width=cfg.width, verify_size=cfg.verify_size,
                    radar_max_calls=cfg.max_calls, radar_alpha=cfg.alpha, radar_count_bonus=cfg.count_bonus,
                    radar_reward=cfg.reward, episode_cycles=1, autoreset=False, seed=cfg.seed,
                    obs_variant=cfg.obs_variant, objective=cfg.objective, rate_ref=cfg.rate_ref)
    net = RadarNet(env.obs_dim, cfg.hidden, cfg.mlp_hidden, 2)
    opt = torch.optim.Adam(net.parameters(), lr=cfg.lr)
    rng = np.random.default_rng(cfg.seed)
    history, best_val, best = [], -np.inf, None
    pol = lambda n: RadarPolicy(n, width=cfg.width, verify_size=cfg.verify_size, max_calls=cfg.max_calls,
                                obs_variant=cfg.obs_variant)
    bar = tqdm(range(cfg.steps), desc="RADAR", unit="step", disable=not progress, leave=False)
    t0 = time.perf_counter()
    rets, depths = [], []
    for step in bar:
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


def run_cli(args) -> int:
    from pathlib import Path

    t0 = time.perf_counter()
    data = load_training_data(args.logs, args.model, args.temperature, args.dataset, args.split, args.width,
                              profile=args.profile, latency_root=args.latency,
                              dtype=getattr(args, "dtype", None),
                              latency_dtype=getattr(args, "latency_dtype", None))
    cfg = RadarConfig(width=data.train.width, seed=args.seed, obs_variant=getattr(args, "obs", "paper"))
    cfg = replace(cfg, verify_size=resolve_verify_size(args, data, cfg.verify_size),
                  objective=getattr(args, "objective", "ratio"), rate_ref=resolve_rate_ref(args, data))
    if args.steps:
        cfg = replace(cfg, steps=args.steps, eval_every=max(1, min(cfg.eval_every, args.steps // 4 or 1)))
    if args.n_envs:
        cfg = replace(cfg, batch=args.n_envs)
    res = train_radar(data, cfg, progress=not args.no_progress)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    plot_history(res["history"], out / "training_curve.png", f"RADAR on {data.train.model} (replay)")
    summary = {"method": "radar", "out": str(out), "val_tokens_per_s": res["val"],
               "reference": reference_speeds(data.val, data.latency), "config": asdict(cfg),
               "logs": logs_info(data, args.logs), "curve": str(out / "training_curve.png"),
               "history": res["history"], "wall_s": time.perf_counter() - t0}
    dim = rich.obs_dim("radar", cfg.obs_variant, cfg.width)
    spec = {"type": "radar_lstm", "in": dim, "hidden": cfg.hidden, "mlp_hidden": cfg.mlp_hidden, "out": 2}
    save_policy(out, out.name, "radar", {"radar": {
        "module": res["net"], "net": spec,
        "obs": {"name": "radar", "variant": cfg.obs_variant, "width": cfg.width, "dim": dim},
        "action": {"type": "stop_continue", "max_depth": cfg.max_calls}}},
        {"width": cfg.width, "verify_size": cfg.verify_size, "max_depth": cfg.max_calls},
        {k: v for k, v in summary.items() if k != "history"})
    return finish(out, summary, args.json)
