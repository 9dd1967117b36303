"""Re-SpS (arXiv:2601.12212): PPO picks a tree shape (V, D, W), held for N cycles.

Actions: Re-SpS's (V in {32..128}, D in {3..8}, W in {8..32}) with V <= W^(D-1), V snapped to
the logged grid and W restricted to the logged widths (`env.resps_shapes`).
State: the probability-feature variant `resps_obs` (documented in simulator/observations/paper.py; the paper
uses target hidden states). Reward: mean cycle throughput (L+1)/t_cycle over the held cycles,
with the policy call charged to the first (our reward includes the draft cost, which the
paper's timed window left out). Held N = 10 cycles in training, 30 at inference (manifest).
Each step is one decision; we treat it as a contextual bandit (PPO boundary "step"), episodes
are whole sequences so states come from real trajectories.
PPO as the paper's manual PPO: 4 epochs, minibatch 32, clip 0.2, entropy 0.1, lr 3e-4;
actor/critic MLP [128, 128].
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace


from simulator.observations import rich
from simulator.envs.vector import make_replay_env, resps_shapes
from simulator.methods.checkpoint import save_policy
from simulator.methods.resps.policy import RespsPolicy
from simulator.train.ppo import PPOConfig, mlp_spec, ppo_train
from simulator.train.common import PolicyTrainConfig, TrainData, TrainMethod, replay_tokens_per_s, resolve_rate_ref


@dataclass
class RespsConfig:
    hold_train: int = 10
    hold_infer: int = 30
    steps: int = 30_000                  # decisions (each = hold_train cycles)
    seed: int = 0
    action_space: str = "seeds"          # seeds | wide (env.resps_shapes)
    obs_variant: str = "paper"           # paper (probability features) | rich (observations_rich)
    objective: str = "ratio"             # ratio: mean (L+1)/t over the held cycles | rate: sum (L+1) - rate_ref t
    rate_ref: float = 0.0                # rate: tokens/s to beat (grid-best's on train, resolve_rate_ref)
    ppo: PPOConfig = field(default_factory=lambda: PPOConfig(
        n_envs=64, n_steps=32, minibatch=32, epochs=4, clip=0.2, ent_coef=0.1, lr=3e-4, warmup_frac=0.0,
        gamma=0.0, actor_hidden=(128, 128), critic_hidden=(128, 128), boundary="step", eval_every=5))


def train_resps(data: TrainData, cfg: RespsConfig, progress: bool = True) -> dict:
    lat = data.latency
    shapes = resps_shapes(data.train, space=cfg.action_space)
    make = lambda logs: make_replay_env(logs, lat, "shape", n_envs=cfg.ppo.n_envs, hold_cycles=cfg.hold_train,
                                        shapes=tuple(map(tuple, shapes.tolist())), seed=cfg.seed,
                                        obs_variant=cfg.obs_variant, objective=cfg.objective, rate_ref=cfg.rate_ref)
    env = make(data.train)
    pc = replace(cfg.ppo, total_steps=cfg.steps, seed=cfg.seed)
    pol = lambda a: RespsPolicy(a, shapes, hold=cfg.hold_infer, max_depth=data.train.max_depth,
                                obs_variant=cfg.obs_variant)
    r = ppo_train(env, pc, validate=lambda a: replay_tokens_per_s(pol(a), data.val, lat), desc="Re-SpS",
                  progress=progress, phase="resps",
                  refill=(lambda k: make(data.window(k))) if data.refill is not None else None)
    return {"net": r["best_actor"], "shapes": shapes, "history": r["history"], "val": r["best_val"]}


def configure(cfg: PolicyTrainConfig, data: TrainData) -> RespsConfig:
    """RespsConfig from `draftgym train`'s settings (steps: decisions; n_envs: PPO's envs)."""
    c = RespsConfig(seed=cfg.seed, action_space=cfg.action_space, obs_variant=cfg.obs, objective=cfg.objective,
                    rate_ref=resolve_rate_ref(cfg, data))
    if cfg.steps:
        c = replace(c, steps=cfg.steps)
    if cfg.n_envs:
        c = replace(c, ppo=replace(c.ppo, n_envs=cfg.n_envs))
    return c


def _results(res: dict) -> dict:
    return {"val_tokens_per_s": res["val"], "shapes": res["shapes"].tolist()}


def _save(out, res: dict, cfg: RespsConfig, data: TrainData, training: dict) -> None:
    save_policy(out, out.name, "resps", {"shape": {
        "module": res["net"], "net": mlp_spec(rich.obs_dim("resps", cfg.obs_variant), cfg.ppo.actor_hidden,
                                              len(res["shapes"])),
        "obs": {"name": "resps", "variant": cfg.obs_variant, "dim": rich.obs_dim("resps", cfg.obs_variant),
                "max_depth": data.train.max_depth},
        "action": {"type": "shape", "shapes": res["shapes"].tolist(), "hold": cfg.hold_infer}}},
        {"max_depth": data.train.max_depth}, training)


METHOD = TrainMethod("Re-SpS", all_widths=True, configure=configure, train=train_resps, results=_results, save=_save)
