"""LTD (Learning to Draft, arXiv:2603.01639): a depth policy and a size policy trained with PPO in the replay simulator,
then co-adapted.

Policies (LTD Appendix A.2/A.3):
    depth  pi_D: obs `ltd_depth_obs` (W*W + 2), STOP/CONTINUE after each draft forward, D <= 12.
           Actor MLP [1024], critic MLP [1024, 256], gamma 0.999. One depth episode is one draft
           phase (reward (L+1)/t_cycle at the stop, 0 before): PPO boundary "cycle".
    size   pi_V: obs `ltd_size_obs` (W + 11 W^2 + 2), 12 actions -> V = 20..240.
           Actor and critic MLP [1024, 256]. One step per cycle, reward (L+1)/t_cycle; we train it
           as a contextual bandit (boundary "step", gamma then has no effect): LTD's gamma = 0.9
           over consecutive cycles would sum per-cycle throughputs, which favours short cycles.
    shared PPO: 2048-step rollouts, minibatch 256, 20 epochs, entropy 0.01, lr 1e-3 with a 1 %
           warm-up then linear decay (simulator/train/ppo.py).

Co-adaptation (LTD Sec. 4): Iter0 trains both independently (depth with V = 60; size with D
drawn uniformly from 1..12), Iter1 retrains size against the Iter0 depth policy, Iter2 depth
against the Iter1 size policy, Iter3 size against the Iter2 depth policy. Each phase continues
from the previous weights and keeps the checkpoint with the best validation tokens/s (replay of
whole val sequences with both policies in the loop, policy-call cost included); the saved policy
is the best validated (depth, size) pair over the co-adapted phases.
Step budgets default to 200k (depth) and 50k (size) per phase (the paper: 1M / 100k on GPUs).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace

import numpy as np

from simulator.observations import paper as obs
from simulator.observations import rich
from simulator.envs.vector import make_replay_env
from simulator.methods.checkpoint import save_policy
from simulator.methods.ltd.policy import LTDPolicy
from simulator.train.ppo import PPOConfig, mlp_spec, ppo_train
from simulator.train.common import (PolicyTrainConfig, TrainData, TrainMethod, greedy, replay_tokens_per_s,
                                    resolve_rate_ref, resolve_verify_size)


@dataclass
class LTDConfig:
    width: int = 10
    max_depth: int = 12
    verify_size: int = 60                   # V while the depth policy trains alone (Iter0)
    fixed_depth: int = 8                    # D while the size policy is validated alone (Iter0)
    depth_steps: int = 200_000
    size_steps: int = 50_000
    iters: tuple[int, ...] = (0, 1, 2, 3)
    seed: int = 0
    obs_variant: str = "paper"              # paper (LTD's observations) | rich (observations_rich)
    objective: str = "ratio"                # ratio: LTD's (L+1)/t_cycle | rate: (L+1) - rate_ref t (env_core)
    rate_ref: float = 0.0                   # rate: tokens/s to beat (grid-best's on train, resolve_rate_ref)
    size_values: tuple[int, ...] = obs.SIZE_ACTIONS   # size actions (observations.size_actions; "wide" on CPUs)
    depth_ppo: PPOConfig = field(default_factory=lambda: PPOConfig(
        gamma=0.999, actor_hidden=(1024,), critic_hidden=(1024, 256), boundary="cycle"))
    size_ppo: PPOConfig = field(default_factory=lambda: PPOConfig(
        gamma=0.9, actor_hidden=(1024, 256), critic_hidden=(1024, 256), boundary="step"))


def _size_values_fn(net, values=obs.SIZE_ACTIONS):
    g = greedy(net)
    return lambda o: np.asarray(values)[g(o)]


def _continue_fn(net):
    g = greedy(net)
    return lambda o: g(o) == 1


def train_ltd(data: TrainData, cfg: LTDConfig, progress: bool = True) -> dict:
    lat, W = data.latency, cfg.width
    depth = {"actor": None, "critic": None}
    size = {"actor": None, "critic": None}
    history: list[dict] = []
    results = {}
    best = {"val": -np.inf, "depth": None, "size": None, "phase": None}   # best validated pair (Iter1..3)

    def keep_best(tag):
        if depth["actor"] is not None and size["actor"] is not None and results[tag] > best["val"]:
            best.update(val=results[tag], depth=depth["actor"], size=size["actor"], phase=tag)

    def policy(d=None, s=None):
        return LTDPolicy(d, s, width=W, max_depth=cfg.max_depth, verify_size=cfg.verify_size,
                         fixed_depth=cfg.fixed_depth, size_values=cfg.size_values, obs_variant=cfg.obs_variant)

    phase = itertools.count()                         # phase k trains on data.window(k) (a refill on large logs)

    def run_depth(tag, size_actor):
        env = make_replay_env(data.window(next(phase)), lat, "depth", n_envs=cfg.depth_ppo.n_envs, width=W, max_depth=cfg.max_depth,
                        verify_size=cfg.verify_size, seed=cfg.seed, obs_variant=cfg.obs_variant,
                        objective=cfg.objective, rate_ref=cfg.rate_ref,
                        size_policy=None if size_actor is None else _size_values_fn(size_actor, cfg.size_values))
        pc = replace(cfg.depth_ppo, total_steps=cfg.depth_steps, seed=cfg.seed)
        r = ppo_train(env, pc, depth["actor"], depth["critic"],
                      validate=lambda a: replay_tokens_per_s(policy(a, size_actor), data.val, lat),
                      desc=f"LTD {tag}", progress=progress, history=history, phase=tag)
        depth.update(actor=r["best_actor"], critic=r["critic"])
        results[tag] = r["best_val"]
        keep_best(tag)

    def run_size(tag, depth_actor):
        env = make_replay_env(data.window(next(phase)), lat, "size", n_envs=cfg.size_ppo.n_envs, width=W, max_depth=cfg.max_depth,
                        seed=cfg.seed + 1, obs_variant=cfg.obs_variant, objective=cfg.objective,
                        rate_ref=cfg.rate_ref, depth_policy=None if depth_actor is None else _continue_fn(depth_actor),
                        size_values=cfg.size_values)
        pc = replace(cfg.size_ppo, total_steps=cfg.size_steps, seed=cfg.seed + 1)
        r = ppo_train(env, pc, size["actor"], size["critic"],
                      validate=lambda a: replay_tokens_per_s(policy(depth_actor, a), data.val, lat),
                      desc=f"LTD {tag}", progress=progress, history=history, phase=tag)
        size.update(actor=r["best_actor"], critic=r["critic"])
        results[tag] = r["best_val"]
        if depth_actor is not None:                  # Iter0's size alone is validated at a fixed depth
            keep_best(tag)

    for it in cfg.iters:
        if it == 0:
            run_depth("iter0-depth", None)
            run_size("iter0-size", None)
        elif it in (1, 3):
            run_size(f"iter{it}-size", depth["actor"])
        elif it == 2:
            run_depth("iter2-depth", size["actor"])
        else:
            raise ValueError(f"LTD iterations are 0..3, got {it}")
    if best["phase"] is not None:                    # the best co-adapted pair (LTD keeps the best checkpoint)
        depth["actor"], size["actor"] = best["depth"], best["size"]
    final = policy(depth["actor"], size["actor"])
    results["final"] = replay_tokens_per_s(final, data.val, lat)
    return {"depth": depth["actor"], "size": size["actor"], "history": history, "val": results,
            "final_phase": best["phase"] or (f"iter{cfg.iters[-1]}" if cfg.iters else None)}


def save_ltd(out, name: str, depth_net, size_net, cfg: LTDConfig, training: dict):
    comps = {}
    if depth_net is not None:
        dim = rich.obs_dim("ltd_depth", cfg.obs_variant, cfg.width)
        comps["depth"] = {"module": depth_net,
                          "net": mlp_spec(dim, cfg.depth_ppo.actor_hidden, 2),
                          "obs": {"name": "ltd_depth", "variant": cfg.obs_variant, "width": cfg.width, "dim": dim},
                          "action": {"type": "stop_continue", "max_depth": cfg.max_depth}}
    if size_net is not None:
        dim = rich.obs_dim("ltd_size", cfg.obs_variant, cfg.width, cfg.max_depth)
        comps["size"] = {"module": size_net, "net": mlp_spec(dim, cfg.size_ppo.actor_hidden, len(cfg.size_values)),
                         "obs": {"name": "ltd_size", "variant": cfg.obs_variant, "width": cfg.width,
                                 "max_depth": cfg.max_depth, "dim": dim},
                         "action": {"type": "verify_size", "values": list(cfg.size_values)}}
    return save_policy(out, name, "ltd", comps, {"width": cfg.width, "max_depth": cfg.max_depth,
                                                 "verify_size": cfg.verify_size, "depth": cfg.fixed_depth}, training)


def configure(cfg: PolicyTrainConfig, data: TrainData) -> LTDConfig:
    """LTDConfig for the logs' width and `draftgym train`'s settings: seed, observations, action space
    (size actions), V, objective, budget (steps: depth phases; size phases a quarter, at least 2048),
    iterations and envs."""
    c = LTDConfig(width=data.train.width, seed=cfg.seed, obs_variant=cfg.obs)
    if cfg.action_space != "seeds":
        c = replace(c, size_values=obs.size_actions(cfg.action_space, data.train.verify_grid))
    c = replace(c, verify_size=resolve_verify_size(cfg, data, c.verify_size), objective=cfg.objective,
                rate_ref=resolve_rate_ref(cfg, data))
    if cfg.steps:
        c = replace(c, depth_steps=cfg.steps, size_steps=max(2048, cfg.steps // 4))
    if cfg.iters:
        c = replace(c, iters=tuple(cfg.iters))
    if cfg.n_envs:
        c = replace(c, depth_ppo=replace(c.depth_ppo, n_envs=cfg.n_envs), size_ppo=replace(c.size_ppo, n_envs=cfg.n_envs))
    return c


def _results(res: dict) -> dict:
    return {"val_tokens_per_s": res["val"]["final"], "val_by_phase": res["val"], "final_phase": res["final_phase"]}


def _save(out, res: dict, c: LTDConfig, data: TrainData, training: dict) -> None:
    save_ltd(out, out.name, res["depth"], res["size"], c, training)


METHOD = TrainMethod("LTD", all_widths=False, configure=configure, train=train_ltd, results=_results, save=_save)
