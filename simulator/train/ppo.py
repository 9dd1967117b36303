"""A small, readable PPO (CleanRL style) for the numpy replay envs, plus training utilities.

Rollout: n_envs x n_steps transitions from a vectorised env (LTD: a 2048-step buffer).
Advantages: GAE(gamma, lambda),

    delta_t = r_t + gamma V(s_{t+1}) (1 - b_t) - V(s_t),   A_t = delta_t + gamma lambda (1 - b_t) A_{t+1}

where b_t marks an episode boundary after step t. Boundaries (`PPOConfig.boundary`):
    "env"    terminated | truncated (the env's episodes)
    "cycle"  also every cycle end (`info["cycle_end"]`): LTD's depth episodes are one draft phase,
             the reward arriving at STOP; envs still run whole sequences, so states are visited
             as real decoding visits them
    "step"   every step (a contextual bandit: the size and Re-SpS envs, one cycle / one hold per step)
Loss: clipped surrogate (clip eps) + vf_coef * value MSE - ent_coef * entropy; Adam with a linear
warm-up over warmup_frac of the updates then linear decay to 0 (LTD), grad-norm clipping.
Rewards are divided by a running std of the discounted return (gymnasium's NormalizeReward).
Speed: with LTD's nets (actor [1024], critic [1024, 256]) an update is 160 minibatch steps of
~0.7 GFLOP each, so matmuls dominate; `amp` runs them in bf16 where the CPU has bf16 units.
"""
from __future__ import annotations

import contextlib
import copy
import math
import time
from dataclasses import asdict, dataclass

import numpy as np

from simulator.train.common import window_starts


@dataclass
class PPOConfig:
    total_steps: int = 200_000
    n_envs: int = 256
    n_steps: int = 8                       # rollout buffer n_envs * n_steps = 2048 (LTD)
    minibatch: int = 256                   # LTD
    epochs: int = 20                       # LTD: 20 epochs per update
    gamma: float = 0.999                   # LTD depth 0.999 (size 0.9; see simulator/methods/ltd/train.py)
    gae_lambda: float = 0.95               # SB3 default
    clip: float = 0.2
    ent_coef: float = 0.01                 # LTD
    vf_coef: float = 0.5
    lr: float = 1e-3                       # LTD: 1e-3, warm-up 1 %, then linear decay to 0
    warmup_frac: float = 0.01
    max_grad_norm: float = 0.5
    actor_hidden: tuple[int, ...] = (1024,)
    critic_hidden: tuple[int, ...] = (1024, 256)
    boundary: str = "env"                  # env | cycle | step
    normalize_reward: bool = True
    eval_every: int = 10                   # updates between validations (0: never)
    amp: str = "auto"                      # update forwards in bf16 autocast: auto (where the CPU has bf16
                                           # matrix units, AMX / AVX512-BF16) | bf16 | off. Weights, Adam and
                                           # the saved policy stay fp32; log-softmax and the losses run in fp32
    seed: int = 0


def mlp_spec(n_in: int, hidden, n_out: int, obs_norm: bool = True) -> dict:
    return {"type": "mlp", "in": int(n_in), "hidden": [int(h) for h in hidden], "out": int(n_out), "obs_norm": obs_norm}


def sample_observations(env, n_steps: int = 64, seed: int = 0) -> np.ndarray:
    """Observations from random play (for input standardisation); the env is reset afterwards by the caller."""
    rng = np.random.default_rng(seed)
    o, _ = env.reset(seed=seed)
    out = [o]
    for _ in range(n_steps):
        o, *_ = env.step(rng.integers(0, env.n_actions, env.n))
        out.append(o)
    return np.concatenate(out)


class RunningReturnStd:
    """Scale rewards by the std of a running discounted return (per env)."""

    def __init__(self, n_envs: int, gamma: float):
        self.ret = np.zeros(n_envs)
        self.gamma = gamma
        self.count, self.mean, self.var = 1e-4, 0.0, 1.0

    def __call__(self, r: np.ndarray, done: np.ndarray) -> np.ndarray:
        self.ret = self.ret * self.gamma + r
        b_mean, b_var, n = self.ret.mean(), self.ret.var(), len(self.ret)
        delta, tot = b_mean - self.mean, self.count + n
        self.mean += delta * n / tot
        self.var = (self.var * self.count + b_var * n + delta ** 2 * self.count * n / tot) / tot
        self.count = tot
        self.ret[done] = 0.0
        return r / math.sqrt(self.var + 1e-8)


def ppo_train(env, cfg: PPOConfig, actor=None, critic=None, validate=None, desc: str = "ppo", progress: bool = True,
              history: list | None = None, phase: str = "", refill=None) -> dict:
    """Train (or continue training) actor/critic on `env`. validate(actor) -> float (higher is better):
    the best validated actor is returned. Returns {"actor", "critic", "best_actor", "best_val", "history"}.
    refill(k) -> env (logs larger than memory): the env of window k, swapped in at the update where the
    run's k-th part begins (common.window_starts); the episodes the last rollout left open end there,
    bootstrapped from their value as at any rollout's end, and the new env starts from a reset."""
    import torch
    from tqdm import tqdm

    from simulator.policies.nets import build_net

    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    autocast, amp_used = _autocast(cfg.amp)
    obs_dim, n_act = env.obs_dim, env.n_actions
    if actor is None or critic is None:
        from simulator.policies.nets import set_obs_norm

        sample = sample_observations(env, seed=cfg.seed)
        if actor is None:
            actor = build_net(mlp_spec(obs_dim, cfg.actor_hidden, n_act))
            set_obs_norm(actor, sample)
        if critic is None:
            critic = build_net(mlp_spec(obs_dim, cfg.critic_hidden, 1))
            set_obs_norm(critic, sample)
    params = list(actor.parameters()) + list(critic.parameters())
    opt = torch.optim.Adam(params, lr=cfg.lr, eps=1e-5)
    batch = cfg.n_envs * cfg.n_steps
    n_updates = max(1, cfg.total_steps // batch)
    warm = max(1, int(round(cfg.warmup_frac * n_updates)))
    norm = RunningReturnStd(cfg.n_envs, cfg.gamma) if cfg.normalize_reward else None
    history = [] if history is None else history
    o, _ = env.reset(seed=cfg.seed)
    buf_o = np.zeros((cfg.n_steps, cfg.n_envs, obs_dim), np.float32)
    buf_a = np.zeros((cfg.n_steps, cfg.n_envs), np.int64)
    buf_lp, buf_v, buf_r, buf_b = (np.zeros((cfg.n_steps, cfg.n_envs), np.float32) for _ in range(4))
    best_val, best_actor = -np.inf, None
    bar = tqdm(range(n_updates), desc=desc, unit="upd", disable=not progress, leave=False)
    t0, raw_r = time.perf_counter(), []
    starts = window_starts(n_updates) if refill is not None else {}
    for upd in bar:
        if upd in starts:
            env = None
            env = refill(starts[upd])
            o, _ = env.reset(seed=cfg.seed + upd)
            if norm is not None:
                norm.ret[:] = 0.0                                   # the open episodes ended here
        lr = cfg.lr * min((upd + 1) / warm, max(0.0, (n_updates - upd) / max(1, n_updates - warm)))
        for g in opt.param_groups:
            g["lr"] = lr
        # ---- rollout
        for t in range(cfg.n_steps):
            with torch.no_grad(), autocast():                       # as in the update: ratio 1 at its start
                x = torch.from_numpy(o)
                logp = actor(x).float().log_softmax(-1)                # [n_envs, A]
                v = critic(x).float().squeeze(-1)                      # [n_envs]
                a = torch.multinomial(logp.exp(), 1, True).squeeze(1)  # a ~ pi(. | s)
                lp_a = logp.gather(1, a[:, None]).squeeze(1)
            o2, r, term, trunc, info = env.step(a.numpy())
            b = term | trunc
            if cfg.boundary == "cycle":
                b = b | info.get("cycle_end", np.ones_like(b))
            elif cfg.boundary == "step":
                b = np.ones_like(b)
            raw_r.append(r[b].mean() if b.any() else np.nan)
            buf_o[t], buf_a[t], buf_lp[t], buf_v[t] = o, a.numpy(), lp_a.numpy(), v.numpy()
            buf_r[t] = norm(r, b) if norm is not None else r
            buf_b[t] = b
            o = o2
        with torch.no_grad(), autocast():
            v_last = critic(torch.from_numpy(o)).float().squeeze(-1).numpy()
        adv = np.zeros_like(buf_r)
        last = np.zeros(cfg.n_envs, np.float32)
        for t in reversed(range(cfg.n_steps)):
            nv = v_last if t == cfg.n_steps - 1 else buf_v[t + 1]
            nonterm = 1.0 - buf_b[t]
            delta = buf_r[t] + cfg.gamma * nv * nonterm - buf_v[t]
            last = delta + cfg.gamma * cfg.gae_lambda * nonterm * last
            adv[t] = last
        ret = adv + buf_v
        # ---- update
        fo = torch.from_numpy(buf_o.reshape(batch, obs_dim))
        fa = torch.from_numpy(buf_a.reshape(batch))
        flp = torch.from_numpy(buf_lp.reshape(batch))
        fadv = torch.from_numpy(adv.reshape(batch))
        fret = torch.from_numpy(ret.reshape(batch))

        def minibatch_loss(mb):
            x_mb = fo[mb]                                              # [B, obs_dim]
            with autocast():
                logits, value = actor(x_mb), critic(x_mb)
            logp = logits.float().log_softmax(-1)                      # [B, A] log pi(. | s)
            lp = logp.gather(1, fa[mb, None]).squeeze(1)               # [B]  log pi(a | s)
            ent = -(logp.exp() * logp).sum(-1)                         # [B]  H(pi(. | s))
            return clipped_loss(lp, flp[mb], fadv[mb], value.float().squeeze(-1), fret[mb], ent, cfg)

        stats = update(opt, params, batch, cfg, rng, minibatch_loss, foreach=True)   # [pg, v, entropy]
        fin = env.drain_finished() if hasattr(env, "drain_finished") else []
        rec = {"phase": phase, "update": upd, "steps": (upd + 1) * batch,
               "reward": float(np.nanmean(raw_r)) if raw_r else float("nan"),
               "episode_tokens_per_s": float(np.mean([f["tokens_per_s"] for f in fin])) if fin else float("nan"),
               "pg_loss": float(stats[0]), "v_loss": float(stats[1]), "entropy": float(stats[2]),
               "lr": lr, "amp": amp_used, "wall_s": time.perf_counter() - t0}
        raw_r = []
        if validate is not None and cfg.eval_every and ((upd + 1) % cfg.eval_every == 0 or upd == n_updates - 1):
            actor.eval()
            val = float(validate(actor))
            actor.train()
            rec["val"] = val
            if val > best_val:
                best_val, best_actor = val, copy.deepcopy(actor).eval()
        history.append(rec)
        bar.set_postfix(reward=f"{rec['reward']:.3g}", ent=f"{rec['entropy']:.2f}",
                        val=f"{rec.get('val', float('nan')):.3g}")
    bar.close()
    actor.eval()
    if best_actor is None:
        best_actor = copy.deepcopy(actor).eval()
    return {"actor": actor, "critic": critic, "best_actor": best_actor, "best_val": best_val, "history": history,
            "config": asdict(cfg)}


def clipped_loss(lp, lp_old, adv, value, ret, ent, cfg):
    """One minibatch's PPO loss (CleanRL), for any policy whose log-prob and entropy per row are given:

        rho  = exp(log pi(a | s) - log pi_old(a | s))          A standardised over the minibatch
        loss = -min(rho A, clip(rho, 1 - eps, 1 + eps) A) + c_v 1/2 (V(s) - R)^2 - c_H H(pi(. | s))

    lp, lp_old, adv, value, ret, ent: [B]; cfg has clip, vf_coef, ent_coef. Returns (loss, [pg, v, H])."""
    import torch

    ratio = (lp - lp_old).exp()                                        # pi / pi_old
    a = (adv - adv.mean()) / (adv.std() + 1e-8)
    pg = torch.max(-a * ratio, -a * ratio.clamp(1 - cfg.clip, 1 + cfg.clip)).mean()
    vl = 0.5 * (value - ret).pow(2).mean()
    ent = ent.mean()
    return pg + cfg.vf_coef * vl - cfg.ent_coef * ent, torch.stack([pg, vl, ent]).detach()


def update(opt, params, batch: int, cfg, rng, minibatch_loss, foreach=None) -> list[float]:
    """PPO's update: cfg.epochs passes over the rollout's `batch` rows in shuffled minibatches of
    cfg.minibatch; minibatch_loss(rows) -> (loss, stats) (clipped_loss); Adam steps after grad-norm
    clipping at cfg.max_grad_norm. Returns the stats' mean over minibatches (one host read an update)."""
    import torch
    import torch.nn as nn

    stats = []
    for _ in range(cfg.epochs):
        perm = torch.from_numpy(rng.permutation(batch))
        for s in range(0, batch, cfg.minibatch):
            loss, st = minibatch_loss(perm[s: s + cfg.minibatch])
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(params, cfg.max_grad_norm, foreach=foreach)
            opt.step()
            stats.append(st)
    return torch.stack(stats).mean(0).tolist()


def _autocast(amp: str):
    """(context factory, "bf16" | "off"): bf16 autocast on the CPU (PPOConfig.amp), or a no-op."""
    import torch

    if amp not in ("auto", "bf16", "off"):
        raise ValueError(f"amp must be auto | bf16 | off, got {amp!r}")
    if amp == "auto":
        from pipeline.models.target import cpu_has_bf16_units
        amp = "bf16" if cpu_has_bf16_units() else "off"
    if amp == "off":
        return contextlib.nullcontext, amp
    return (lambda: torch.autocast("cpu", dtype=torch.bfloat16)), amp


def plot_history(history: list[dict], path, title: str = "") -> None:
    """Training curve: per-phase reward vs steps, and validation tokens/s."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4))
    phases = list(dict.fromkeys(h.get("phase", "") for h in history))
    offset = 0
    for ph in phases:
        hs = [h for h in history if h.get("phase", "") == ph]
        x = offset + np.array([h["steps"] for h in hs])
        a1.plot(x, [h["reward"] for h in hs], label=ph or "reward")
        v = [(xx, h["val"]) for xx, h in zip(x, hs) if "val" in h]
        if v:
            a2.plot(*zip(*v), "o-", ms=3, label=ph or "val")
        offset = x[-1] if len(x) else offset
    a1.set_xlabel("env steps"); a1.set_ylabel("mean cycle reward (tokens/s)"); a1.legend(fontsize=7)
    a2.set_xlabel("env steps"); a2.set_ylabel("validation tokens/s (replay)"); a2.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
