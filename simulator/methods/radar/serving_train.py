"""`draftgym train-load --method radar`: RADAR at batch size B, trained by REINFORCE with a baseline in
the serving replay. Settings (`RadarLoadConfig`), action set and trainer read here; the policy (the
stop/continue walk over depth levels) is simulator/methods/radar/serving_policy.py; train_load.py validates
and saves.

Action set: [off, shape(1) .. shape(Dmax)], shape(D) = (D, W, V(D)), V(D) by the config's rule
("pool": every draft verified, V = 1 + W + (D-1) W^2, the chain's D + 1 at W = 1; or one V per
depth). The walk's decision D is its index in that list: the env, the load replay and the chooser
speak shape indices, and the manifest names every shape the policy can play.

REINFORCE with a learned baseline (plain torch), each decision a one-step episode with the env's
reward r of its held steps (as the other load-aware methods). Per gradient step, n_envs x n_steps
decisions are sampled from the current policy (each level CONTINUEs with pi(C | x_d), D = the first
STOP), then

    log pi(D | s) = sum_{d < D} log pi(CONTINUE | x_d) + [D < Dmax] log pi(STOP | x_D)
    A = r - b(s), standardised over the batch          (b: an MLP over s, fitted by (b(s) - r)^2)
    loss = -mean(A log pi(D | s)) + c_b mean((b(s) - r)^2) - c_H mean(sum_{visited d} H(pi(. | x_d)))

Adam with a linear decay of lr to 0, grad-norm clipping. Every `eval_every` gradient steps (and
after the last) the greedy walk is replayed on the validation sweep (`validate`); the best is kept.
"""
from __future__ import annotations

import copy
import time
from dataclasses import asdict, dataclass

import numpy as np

from pipeline.decode import step_shape
from pipeline.errors import DataError, DraftGymError
from simulator.methods.radar.serving_policy import EXTRA_INPUTS, METHOD, RadarLoadPolicy, level_inputs, stop_depth
from simulator.policies.base import CONTINUE, STOP
from simulator.serving.inputs import lookup_verify
from simulator.train.ppo import mlp_spec


@dataclass
class RadarLoadConfig:
    """`draftgym train-load --method radar` settings (the shared ones, hold, steps, seed, observation, are
    train_load.LoadTrainConfig's)."""
    width: int = 0                         # W of every drafting shape (0: 1 when width-1 logs exist, else the primary width)
    max_depth: int = 6                     # Dmax: the walk stops at D in 0 (off) .. Dmax
    verify: str = "pool"                   # V(D): pool (V = 1 + W + (D-1) W^2; W = 1: the chain's D + 1) or Dmax
                                           # comma-separated V for D = 1 .. Dmax
    hidden: tuple = (64, 64)               # the stop/continue MLP's and the baseline's hidden layers
    n_envs: int = 64                       # servers replayed in parallel
    n_steps: int = 4                       # decisions per server per gradient step: batch n_envs x n_steps
    lr: float = 1e-3                       # decays linearly to 0 (RADAR's Adam lr)
    ent_coef: float = 0.01                 # c_H
    baseline_coef: float = 0.5             # c_b
    max_grad_norm: float = 0.5
    eval_every: int = 20                   # gradient steps between validations (the last one always validates)


# ------------------------------------------------------------------ the action set

def verify_sizes(cfg: RadarLoadConfig) -> list[int]:
    """V(D) for D = 1 .. Dmax (the config's rule)."""
    if cfg.max_depth < 1:
        raise DataError(f"radar max_depth must be >= 1, got {cfg.max_depth}")
    if cfg.verify == "pool":
        return [1 + step_shape.pool_size(d, cfg.width) for d in range(1, cfg.max_depth + 1)]
    try:
        vs = [int(v) for v in cfg.verify.split(",")]
    except ValueError:
        raise DraftGymError(f"radar verify must be pool or comma-separated ints, got {cfg.verify!r}") from None
    if len(vs) != cfg.max_depth or min(vs) < 2:
        raise DraftGymError(f"radar verify: {cfg.max_depth} values >= 2 (one per depth) needed, got {cfg.verify!r}")
    return vs


def action_shapes(logs, cfg: RadarLoadConfig) -> list:
    """[off, shape(1), .., shape(Dmax)]: index = D; a DataError naming the first the logs cannot replay."""
    out = [step_shape.OFF] + [step_shape.canonical((d, cfg.width, v)) for d, v in enumerate(verify_sizes(cfg), 1)]
    for s in out:
        lookup_verify(logs, s)                              # DataError: depth, width or V not logged
    return out


def components(policy: RadarLoadPolicy, cfg: RadarLoadConfig) -> tuple[dict, dict]:
    """The checkpoint's components (policies/checkpoint.save_policy) and the manifest's "shape" part."""
    dim = int(policy.obs_spec["dim"])
    comps = {"radar": {"module": policy.net, "net": mlp_spec(dim + EXTRA_INPUTS, cfg.hidden, 2),
                       "obs": {**policy.obs_spec, "extra": "depth / max_depth, the level's mean and min confidence"},
                       "action": {"type": "serving_stop_continue", "max_depth": policy.max_depth,
                                  "shapes": policy.shapes, "hold": policy.hold}}}
    return comps, {"width": policy.width, "max_depth": policy.max_depth, "verify": policy.verify}


# ------------------------------------------------------------------ REINFORCE with a baseline

def train(env, cfg: RadarLoadConfig, steps: int, seed: int, validate=None, progress: bool = True,
          name: str = METHOD) -> dict:
    """Train in `env` (a LoadEnv over action_shapes(logs, cfg)) for about `steps` decisions;
    validate(policy) -> tokens/s. Returns {"policy" (the best validated), "best_val", "history", "config"}."""
    import torch
    import torch.nn as nn
    from tqdm import tqdm

    from simulator.policies.nets import build_net, set_obs_norm
    from simulator.train.ppo import sample_observations

    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    Dm, vs = cfg.max_depth, verify_sizes(cfg)
    labels, hold, spec = env.table.labels(), env.cfg.hold, env.spec.to_json()
    dim, m, n = env.obs_dim, env.obs_dim + EXTRA_INPUTS, env.n
    net, baseline = build_net(mlp_spec(m, cfg.hidden, 2)), build_net(mlp_spec(dim, cfg.hidden, 1))
    sample = sample_observations(env, seed=seed)                                      # random play, [k, dim]
    set_obs_norm(net, level_inputs(sample, spec, Dm).reshape(-1, m))
    set_obs_norm(baseline, sample)
    params = [*net.parameters(), *baseline.parameters()]
    opt = torch.optim.Adam(params, lr=cfg.lr, eps=1e-5)
    levels = torch.arange(Dm)
    policy_of = lambda nt: RadarLoadPolicy(nt, labels, hold, spec, name=name, width=cfg.width, verify=vs)

    def walk(o):
        """log pi(. | x_d) [b, Dm, 2] of observations o [b, dim]."""
        x = torch.from_numpy(level_inputs(o, spec, Dm))
        return net(x.reshape(-1, m)).reshape(len(o), Dm, 2).log_softmax(-1)

    batch = n * cfg.n_steps
    n_updates = max(1, steps // batch)
    history, best_val, best = [], -np.inf, None
    o, _ = env.reset(seed=seed)
    t0 = time.perf_counter()
    bar = tqdm(range(n_updates), desc=name, unit="step", disable=not progress, leave=False)
    for upd in bar:
        lr = cfg.lr * (n_updates - upd) / n_updates
        for g in opt.param_groups:
            g["lr"] = lr
        # ---- sample: each level CONTINUEs with pi(CONTINUE | x_d), D = the first STOP; the env plays shape(D)
        obs, depth, rew = [], [], []
        for _ in range(cfg.n_steps):
            with torch.no_grad():
                p_cont = walk(o)[..., CONTINUE].exp().numpy()                          # [n, Dm]
            d = stop_depth(rng.random(p_cont.shape) < p_cont)
            obs.append(o)
            depth.append(d)
            o, r, _, _, _ = env.step(d)
            rew.append(r)
        fo, fd = np.concatenate(obs), torch.from_numpy(np.concatenate(depth))
        fr = torch.from_numpy(np.concatenate(rew).astype(np.float32))
        # ---- one gradient step: log pi(D | s) = sum_{d < D} log pi(C | x_d) + [D < Dm] log pi(S | x_D)
        lw = walk(fo)                                                                   # [b, Dm, 2]
        before, at = levels[None, :] < fd[:, None], levels[None, :] == fd[:, None]     # [b, Dm]
        lp = (lw[..., CONTINUE] * before).sum(1) + (lw[..., STOP] * at).sum(1)          # at is all-False at D = Dm
        ent = (-(lw.exp() * lw).sum(-1) * (before | at)).sum(1)                        # visited levels' entropies
        b = baseline(torch.from_numpy(fo)).squeeze(-1)
        adv = fr - b.detach()
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        pg, bl = -(adv * lp).mean(), (b - fr).pow(2).mean()
        loss = pg + cfg.baseline_coef * bl - cfg.ent_coef * ent.mean()
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
        opt.step()
        pg, bl, ent = torch.stack([pg, bl, ent.mean()]).detach().tolist()
        fin = env.drain_finished()
        rec = {"phase": name, "update": upd, "steps": (upd + 1) * batch, "reward": float(fr.mean()),
               "episode_tokens_per_s": float(np.mean([f["tokens_per_s"] for f in fin])) if fin else float("nan"),
               "off_frac": float((fd == 0).float().mean()), "mean_depth": float(fd.float().mean()),
               "pg_loss": pg, "v_loss": bl, "entropy": ent, "lr": lr, "wall_s": time.perf_counter() - t0}
        if validate is not None and cfg.eval_every and ((upd + 1) % cfg.eval_every == 0 or upd == n_updates - 1):
            cand = policy_of(copy.deepcopy(net).eval())
            rec["val"] = float(validate(cand))
            if rec["val"] > best_val:
                best_val, best = rec["val"], cand
        history.append(rec)
        bar.set_postfix(reward=f"{rec['reward']:.3g}", depth=f"{rec['mean_depth']:.2f}",
                        val=f"{rec.get('val', float('nan')):.3g}")
    bar.close()
    if best is None:
        best = policy_of(net.eval())
    return {"policy": best, "best_val": best_val, "history": history, "config": asdict(cfg)}
