"""`draftgym train-load --method ltd`: LTD at batch size B, trained by PPO on the joint log-prob in the
serving replay. Settings (`LTDLoadConfig`), action set and trainer read here; the policy (two heads,
the decision -> shape index map) is simulator/methods/ltd/serving_policy.py; train_load.py validates and saves.

Action set: every canonical (D, W, V_j), D = 0 (off) .. Dmax, V_j in the size head's grid, W fixed,
deduplicated, off first (`action_shapes`); index[D, j] is the position of (D, W, V_j) in it
(`decision_index`). Why a list and an index: the env (simulator/serving/env.py), the load replay and
the chooser speak shape indices, so they run the method unchanged, the manifest names every shape it
can play, and two decisions that make the same shape are the same action to the env (same reward).

PPO (CleanRL style, plain torch). Each decision is a contextual bandit (gamma 0, as the Re-SpS-style
method): n_envs x n_steps decisions per rollout, D ~ pi_D(. | s), j ~ pi_V(. | s, D), the env plays
index[D, j] for `hold` steps and returns r; advantage A = r - V(s) (critic MLP over s), standardised
per minibatch; `epochs` passes of

    log pi(D, j | s) = log pi_D(D | s) + [D > 0] log pi_V(j | s, D)        (off makes no size decision)
    rho  = exp(log pi(D, j | s) - log pi_old(D, j | s))
    loss = -min(rho A, clip(rho, 1 - eps, 1 + eps) A) + c_v (V(s) - r)^2 - c_H [H(pi_D) + [D > 0] H(pi_V(. | s, D))]

The update is the one of every PPO here (simulator/train/ppo.py `update`, `clipped_loss`); Adam with a
linear decay of lr to 0, grad-norm clipping. Every `eval_every` updates (and after the
last) the greedy policy is replayed on the validation sweep (`validate`); the best one is kept.
"""
from __future__ import annotations

import copy
import time
from dataclasses import asdict, dataclass

import numpy as np

from pipeline.decode import step_shape
from pipeline.errors import DataError, DraftGymError
from simulator.methods.ltd.serving_policy import METHOD, LTDLoadPolicy, size_input
from simulator.serving.inputs import lookup_verify
from simulator.train.ppo import clipped_loss, mlp_spec, update


@dataclass
class LTDLoadConfig:
    """`draftgym train-load --method ltd` settings (the shared ones, hold, steps, seed, observation, are
    train_load.LoadTrainConfig's)."""
    width: int = 0                         # W of every drafting shape (0: 1 when width-1 logs exist, else the primary width)
    max_depth: int = 6                     # Dmax: the depth head picks D in 0 (off) .. Dmax
    verify_sizes: str = "auto"             # the size head's V: auto (the logged grid's V >= 2, up to the first that
                                           # verifies the whole pool at Dmax) or comma-separated ints on the grid
    hidden: tuple = (64, 64)               # the two heads' and the critic's hidden layers
    n_envs: int = 64                       # servers replayed in parallel
    n_steps: int = 16                      # rollout: n_envs x n_steps decisions per update
    minibatch: int = 128
    epochs: int = 4
    clip: float = 0.2                      # eps of the clipped surrogate
    ent_coef: float = 0.01                 # c_H
    vf_coef: float = 0.5                   # c_v
    lr: float = 3e-4                       # decays linearly to 0
    max_grad_norm: float = 0.5
    eval_every: int = 5                    # updates between validations (the last update always validates)


# ------------------------------------------------------------------ the action set

def verify_grid(logs, cfg: LTDLoadConfig) -> list[int]:
    """The size head's V values (the config's `verify_sizes`)."""
    if cfg.verify_sizes != "auto":
        try:
            vs = sorted({int(v) for v in cfg.verify_sizes.split(",")})
        except ValueError:
            raise DraftGymError(f"ltd verify_sizes must be auto or comma-separated ints, got {cfg.verify_sizes!r}") from None
        if not vs or vs[0] < 2:
            raise DraftGymError(f"ltd verify_sizes must be >= 2, got {cfg.verify_sizes!r}")
        return vs
    full = 1 + step_shape.pool_size(cfg.max_depth, cfg.width)               # V verifying every draft of the deepest shape
    grid = sorted(int(v) for v in logs.verify_grid if v >= 2)
    out = [v for v in grid if v < full] + [v for v in grid if v >= full][:1]
    return out or [full]


def action_shapes(logs, cfg: LTDLoadConfig) -> list:
    """Every canonical (D, W, V), D = 0 .. Dmax, V in the grid, deduplicated, off first; a DataError
    naming the first the logs cannot replay."""
    if cfg.max_depth < 1:
        raise DataError(f"ltd max_depth must be >= 1, got {cfg.max_depth}")
    out = list(dict.fromkeys(step_shape.canonical((d, cfg.width, v)) for d in range(cfg.max_depth + 1)
                             for v in verify_grid(logs, cfg)))
    for s in out:
        lookup_verify(logs, s)                              # DataError: depth, width or V not logged
    return out


def decision_index(shapes, width: int, max_depth: int, verify_sizes) -> np.ndarray:
    """[Dmax + 1, len(verify_sizes)]: index[D, j] = the position of canonical(D, W, V_j) in `shapes`."""
    pos = {step_shape.canonical(s): i for i, s in enumerate(shapes)}
    return np.array([[pos[step_shape.canonical((d, width, v))] for v in verify_sizes] for d in range(max_depth + 1)], np.int64)


def components(policy: LTDLoadPolicy, cfg: LTDLoadConfig) -> tuple[dict, dict]:
    """The checkpoint's components (policies/checkpoint.save_policy) and the manifest's "shape" part."""
    dim = int(policy.obs_spec["dim"])
    comps = {"depth": {"module": policy.net, "net": mlp_spec(dim, cfg.hidden, policy.max_depth + 1), "obs": policy.obs_spec,
                       "action": {"type": "serving_depth_size", "shapes": policy.shapes, "index": policy.index.tolist(),
                                  "max_depth": policy.max_depth, "hold": policy.hold}},
             "size": {"module": policy.size_net, "net": mlp_spec(dim + 1, cfg.hidden, len(policy.verify_sizes)),
                      "obs": {**policy.obs_spec, "extra": "depth / max_depth"},
                      "action": {"type": "verify_size", "values": policy.verify_sizes}}}
    return comps, {"width": policy.width, "max_depth": policy.max_depth, "verify_sizes": policy.verify_sizes}


# ------------------------------------------------------------------ PPO on the joint log-prob

def train(env, cfg: LTDLoadConfig, steps: int, seed: int, validate=None, progress: bool = True,
          name: str = METHOD) -> dict:
    """Train in `env` (a LoadEnv over action_shapes(logs, cfg)) for about `steps` decisions;
    validate(policy) -> tokens/s. Returns {"policy" (the best validated), "best_val", "history", "config"}."""
    import torch
    from tqdm import tqdm

    from simulator.policies.nets import build_net, set_obs_norm
    from simulator.train.ppo import sample_observations

    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    Dm, vs = cfg.max_depth, verify_grid(env.logs, cfg)
    labels, hold, spec = env.table.labels(), env.cfg.hold, env.spec.to_json()
    index = decision_index(env.table.shapes, cfg.width, Dm, vs)                          # [Dm + 1, nV]
    dim, nV, n = env.obs_dim, len(vs), env.n
    depth_net, size_net = build_net(mlp_spec(dim, cfg.hidden, Dm + 1)), build_net(mlp_spec(dim + 1, cfg.hidden, nV))
    critic = build_net(mlp_spec(dim, cfg.hidden, 1))
    sample = sample_observations(env, seed=seed)                                        # random play, [m, dim]
    for net in (depth_net, critic):
        set_obs_norm(net, sample)
    set_obs_norm(size_net, size_input(sample, rng.integers(1, Dm + 1, len(sample)), Dm))
    params = [*depth_net.parameters(), *size_net.parameters(), *critic.parameters()]
    opt = torch.optim.Adam(params, lr=cfg.lr, eps=1e-5)
    policy_of = lambda dn, sn: LTDLoadPolicy(dn, sn, labels, index, vs, cfg.width, hold, spec, name=name)

    def joint(x, d, j):
        """log pi(D, j | s) [b] and the entropy H(pi_D) + [D > 0] H(pi_V(. | s, D)) [b] (module docstring)."""
        ld = depth_net(x).log_softmax(-1)                                                # [b, Dm + 1]
        ls = size_net(torch.cat([x, (d.float() / Dm)[:, None]], 1)).log_softmax(-1)    # [b, nV]
        on = (d > 0).float()
        lp = ld.gather(1, d[:, None]).squeeze(1) + on * ls.gather(1, j[:, None]).squeeze(1)
        ent = -(ld.exp() * ld).sum(-1) - on * (ls.exp() * ls).sum(-1)
        return lp, ent

    batch = n * cfg.n_steps
    n_updates = max(1, steps // batch)
    history, best_val, best = [], -np.inf, None
    buf_o = np.zeros((cfg.n_steps, n, dim), np.float32)
    buf_d, buf_j = np.zeros((cfg.n_steps, n), np.int64), np.zeros((cfg.n_steps, n), np.int64)
    buf_lp, buf_r = np.zeros((cfg.n_steps, n), np.float32), np.zeros((cfg.n_steps, n), np.float32)
    o, _ = env.reset(seed=seed)
    t0 = time.perf_counter()
    bar = tqdm(range(n_updates), desc=name, unit="upd", disable=not progress, leave=False)
    for upd in bar:
        lr = cfg.lr * (n_updates - upd) / n_updates
        for g in opt.param_groups:
            g["lr"] = lr
        # ---- rollout: D ~ pi_D(. | s), j ~ pi_V(. | s, D), the env plays index[D, j] for `hold` steps
        for t in range(cfg.n_steps):
            with torch.no_grad():
                x = torch.from_numpy(o)
                d = torch.multinomial(depth_net(x).softmax(-1), 1).squeeze(1)
                j = torch.multinomial(size_net(torch.cat([x, (d.float() / Dm)[:, None]], 1)).softmax(-1), 1).squeeze(1)
                lp, _ = joint(x, d, j)
            buf_o[t], buf_d[t], buf_j[t], buf_lp[t] = o, d.numpy(), j.numpy(), lp.numpy()
            o, r, _, _, _ = env.step(index[d.numpy(), j.numpy()])
            buf_r[t] = r
        # ---- update: bandit advantages A = r - V(s), clipped surrogate on the joint ratio
        fo, fd, fj = (torch.from_numpy(b.reshape(batch, *b.shape[2:])) for b in (buf_o, buf_d, buf_j))
        flp, fr = torch.from_numpy(buf_lp.reshape(batch)), torch.from_numpy(buf_r.reshape(batch))
        with torch.no_grad():
            fadv = fr - critic(fo).squeeze(-1)

        def minibatch_loss(mb):
            lp, ent = joint(fo[mb], fd[mb], fj[mb])
            return clipped_loss(lp, flp[mb], fadv[mb], critic(fo[mb]).squeeze(-1), fr[mb], ent, cfg)

        pg, vl, ent = update(opt, params, batch, cfg, rng, minibatch_loss)
        fin = env.drain_finished()
        rec = {"phase": name, "update": upd, "steps": (upd + 1) * batch, "reward": float(buf_r.mean()),
               "episode_tokens_per_s": float(np.mean([f["tokens_per_s"] for f in fin])) if fin else float("nan"),
               "off_frac": float((buf_d == 0).mean()), "pg_loss": pg, "v_loss": vl, "entropy": ent, "lr": lr,
               "wall_s": time.perf_counter() - t0}
        if validate is not None and cfg.eval_every and ((upd + 1) % cfg.eval_every == 0 or upd == n_updates - 1):
            cand = policy_of(copy.deepcopy(depth_net).eval(), copy.deepcopy(size_net).eval())
            rec["val"] = float(validate(cand))
            if rec["val"] > best_val:
                best_val, best = rec["val"], cand
        history.append(rec)
        bar.set_postfix(reward=f"{rec['reward']:.3g}", ent=f"{ent:.2f}", val=f"{rec.get('val', float('nan')):.3g}")
    bar.close()
    if best is None:
        best = policy_of(depth_net.eval(), size_net.eval())
    return {"policy": best, "best_val": best_val, "history": history, "config": asdict(cfg)}
