"""`draftgym train-load`: a learned load-aware shape policy, trained in the serving replay.

Three methods (`--method`), each deciding the shared shape of the next `hold` steps from the same
load-aware observation, in the same env (simulator/serving/env.py), for the same reward, validated
and saved the same way:

    resps (default)  Re-SpS at batch size B: one categorical over a list of shapes, PPO (below;
                     the checkpoint's method "resps-load", the policy simulator/methods/resps/serving_policy.py)
    ltd              LTD at batch size B: a depth head D in 0..Dmax and a size head V, W fixed, PPO on the
                     joint log-prob (settings, action set, trainer: simulator/methods/ltd/serving_train.py; the
                     policy: simulator/methods/ltd/serving_policy.py)
    radar            RADAR at batch size B: stop / continue at each depth level, V fixed per D by a rule,
                     REINFORCE with a baseline (simulator/methods/radar/serving_train.py; simulator/methods/radar/serving_policy.py)

The env, the replay and `serve-eval` speak shape indices: ltd and radar each build their list of
candidate shapes and map their structured decision (D, V) or D to an index of it (the reasons are in
their trainers). `--width` and `--max-depth` set their W and Dmax (W = 0: 1 when the logs have width 1,
else their primary width); their other settings are LTDLoadConfig's and RadarLoadConfig's.

Method resps (Re-SpS at batch size B): an MLP over the load-aware observation
(simulator/serving/observations.py) picks the shared shape of the next `hold` steps from a fixed set
(simulator/serving/env.py). The action set ("auto"):

    off, chain K = 1..`chains` (what the logs can replay: chains need width-1 logs), and the shape
    `draftgym tune` finds best at each of `tune_batches` on the training split (the schedule's trees),

so the policy can at least play the per-B schedule. PPO (simulator/train/ppo.py, CleanRL style) as
Re-SpS's: each decision a contextual bandit (gamma 0, boundary "step"), 4 epochs, clip 0.2; small
actor and critic MLPs with input standardisation. Validation (every `eval_every` updates, the best
actor kept): the load replay (simulator/serving/load.py) of a Poisson sweep over the validation
split, at the rates that keep about `target_batches` rows busy under AR, with the learned chooser
(simulator/serving/choosers/learned.py): its tokens/s. training.json also holds AR's and the schedule's
tokens/s on the same sweep (the schedule tuned on the training split).

Written to --out: the checkpoint (manifest.json, method "resps-load", "ltd-load" or "radar-load",
loadable by simulator/policy_specs.load_policy), training.json and training_curve.png. Replay it
beside the baselines with `draftgym serve-eval --policy <out>`.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from pipeline.cliargs import parse_positive_ints
from pipeline.decode import step_shape
from pipeline.errors import DataError, DraftGymError
from simulator.methods.checkpoint import save_policy
from simulator.methods.ltd import serving_train as train_ltd
from simulator.methods.ltd.serving_train import LTDLoadConfig
from simulator.methods.radar import serving_train as train_radar
from simulator.methods.radar.serving_train import RadarLoadConfig
from simulator.methods.resps.serving_policy import LoadAwarePolicy
from simulator.serving import arrivals as arr
from simulator.serving import metrics
from simulator.serving.choosers.base import ScheduleChooser, StaticChooser
from simulator.serving.choosers.learned import LearnedChooser
from simulator.serving.env import OBJECTIVES, LoadEnv, LoadEnvConfig
from simulator.serving.inputs import candidates, load_inputs, replayable, ServingLogsConfig
from simulator.serving.load import serve
from simulator.serving.replay import ShapeTable
from simulator.serving.tune import tune
from simulator.train.ppo import PPOConfig, mlp_spec, plot_history, ppo_train

METHODS = ("resps", "ltd", "radar")
ALIASES = {"resps-load": "resps"}                           # the name train-load's one method had
MANIFEST_METHOD = {"resps": "resps-load", "ltd": "ltd-load", "radar": "radar-load"}
MODULES = {"ltd": train_ltd, "radar": train_radar}          # action_shapes(logs, cfg), train(env, cfg, ..), components


@dataclass
class LoadTrainConfig(ServingLogsConfig):
    """`draftgym train-load` settings (and ServingLogsConfig's: its logs root needs latency rows at several B)."""
    out: str = ""                         # policy directory (required)
    method: str = "resps"                 # resps: an MLP picks the step's shape from a list (PPO) | ltd: a depth and
                                          # a size head (PPO) | radar: stop / continue per depth (REINFORCE)
    split: str = "train"                  # training split
    val_split: str = "val"                # validation split (the best validated actor is kept)
    shapes: str = "auto"                  # action set: auto (module docstring) or labels, e.g. "off chain:2 tree:4,10,60"
    chains: int = 6                       # auto: chains K = 1..chains
    tune_batches: str = "1,2,4,8,16"      # auto: the tuned best shape at each of these B joins the set
    max_batch: int = 16                   # most rows in a batch (the observation's M)
    hold: int = 5                         # N: steps a decision is held
    target_batches: str = "1,2,4,8,16,32"  # episode rates (and the validation sweep) keep about these B busy under AR
                                          # (beyond max_batch: overload, the queue grows and B stays at M)
    episode_decisions: int = 32           # decisions per training episode
    objective: str = "ratio"              # reward: ratio (held throughput x AR) | rate (tokens - lambda time)
    rate_ref: float = 1.0                 # rate: lambda = this x AR's tokens/s at the decision's (B, c)
    confidence_depth: int = 1             # the observation's draft confidences at depths 1..k (0: none)
    steps: int = 100_000                  # decisions (env steps over all envs)
    val_requests_per_rate: int = 16       # requests per rate of the validation sweep
    seed: int = 0                         # nets, rollouts, arrivals
    as_json: bool = False                 # print the summary as one JSON object
    progress: bool = True                 # progress bar
    ppo: PPOConfig = field(default_factory=lambda: PPOConfig(
        n_envs=64, n_steps=16, minibatch=128, epochs=4, clip=0.2, ent_coef=0.01, lr=3e-4, warmup_frac=0.0,
        gamma=0.0, actor_hidden=(64, 64), critic_hidden=(64, 64), boundary="step", eval_every=5,
        amp="off"))                       # nets this small gain nothing from bf16 (its casts cost more)
    ltd: LTDLoadConfig = field(default_factory=LTDLoadConfig)          # --method ltd (W, Dmax, V grid, PPO)
    radar: RadarLoadConfig = field(default_factory=RadarLoadConfig)    # --method radar (W, Dmax, V(D), REINFORCE)


def resolve_method(method: str) -> str:
    """resps | ltd | radar (resps-load: resps); a one-line error otherwise."""
    m = ALIASES.get(method, method)
    if m not in METHODS:
        raise DraftGymError(f"unknown load-aware method {method!r} (known: {', '.join(METHODS)})")
    return m


def method_config(cfg: LoadTrainConfig, method: str, logs):
    """ltd / radar: the method's settings with W resolved (0: 1 when the logs have width 1, else their
    primary width); a DataError when the logs lack that width."""
    mcfg = getattr(cfg, method)
    w = mcfg.width or (1 if 1 in logs.w else int(logs.width))
    if w not in logs.w:
        raise DataError(f"--width {w}: not in the logs (widths {sorted(logs.w)})")
    return replace(mcfg, width=w)


def action_shapes(cfg: LoadTrainConfig, logs, schedule) -> list:
    """The action set (module docstring): canonical shapes, off first; `schedule` tuned on `logs`."""
    if cfg.shapes != "auto":
        out = [step_shape.parse(s) for s in cfg.shapes.replace(";", " ").split()]
        missing = [step_shape.label(s) for s in out if not replayable(logs, s)]
        if missing:
            raise DataError(f"--shapes: the logs cannot replay {', '.join(missing)}")
        return list(dict.fromkeys(out))
    out = [step_shape.OFF] + [step_shape.chain(k) for k in range(1, cfg.chains + 1) if replayable(logs, step_shape.chain(k))]
    out += schedule.shapes()
    return list(dict.fromkeys(out))


def val_sweep(cfg: LoadTrainConfig, logs, latency) -> tuple[np.ndarray, list]:
    """Validation arrivals: a Poisson sweep at the rates keeping about target_batches busy under AR."""
    tb = parse_positive_ints(cfg.target_batches, "--target-batches")
    rates = arr.rates_for_logs(tb, logs, latency)
    return arr.sweep(rates, cfg.val_requests_per_rate, cfg.seed), [float(r) for r in rates]


def serve_tokens_per_s(logs, latency, shapes, chooser, arrivals, max_batch) -> float:
    table = ShapeTable(logs, list(dict.fromkeys([*shapes, *chooser.shapes()])))
    return metrics.summarize(serve(logs, latency, table, chooser, arrivals, max_batch))["tokens_per_s"]


def make_policy(actor, shapes, cfg: LoadTrainConfig, obs_spec: dict, name: str = "resps-load") -> LoadAwarePolicy:
    return LoadAwarePolicy(actor, [step_shape.label(s) for s in shapes], hold=cfg.hold, obs=obs_spec, name=name)


def train_load(cfg: LoadTrainConfig) -> dict:
    """Train; returns {"actor" (resps) or "policy" (ltd, radar), "shapes", "obs_spec", "history", "val",
    "reference", "val_rates", "algo" (the method's resolved settings), "schedule"}."""
    method = resolve_method(cfg.method)
    if method != "resps" and cfg.shapes != "auto":
        raise DraftGymError(f"--shapes is resps's action set; --method {method} builds its own from --width and "
                            f"--max-depth")
    if cfg.objective not in OBJECTIVES:
        raise DraftGymError(f"--objective must be one of {', '.join(OBJECTIVES)}, got {cfg.objective!r}")
    train, lat = load_inputs(cfg, cfg.split, cfg.seed)
    val, _ = load_inputs(cfg, cfg.val_split, cfg.seed)
    if train.n_sequences == 0 or val.n_sequences == 0:
        raise DataError(f"no sequences in split {cfg.split!r} or validation split {cfg.val_split!r}")
    sched = tune(train, lat, parse_positive_ints(cfg.tune_batches, "--tune-batches"),
                 candidates(train, "all"))["schedule"]
    if method == "resps":
        shapes, n_envs = action_shapes(cfg, train, sched), cfg.ppo.n_envs
    else:
        mcfg = method_config(cfg, method, train)
        shapes, n_envs = MODULES[method].action_shapes(train, mcfg), mcfg.n_envs
    missing = [step_shape.label(s) for s in shapes if not replayable(val, s)]
    if missing:
        raise DataError(f"the validation split cannot replay {', '.join(missing)}")
    tb = parse_positive_ints(cfg.target_batches, "--target-batches")
    env = LoadEnv(train, lat, shapes, LoadEnvConfig(
        n_envs=n_envs, max_batch=cfg.max_batch, hold=cfg.hold, target_batches=tb,
        episode_decisions=cfg.episode_decisions, objective=cfg.objective, rate_ref=cfg.rate_ref,
        confidence_depth=cfg.confidence_depth, seed=cfg.seed))
    obs_spec = env.spec.to_json()
    arrivals, rates = val_sweep(cfg, val, lat)
    reference = {"ar": serve_tokens_per_s(val, lat, shapes, StaticChooser(step_shape.OFF, "AR"), arrivals, cfg.max_batch),
                 "schedule": serve_tokens_per_s(val, lat, shapes, ScheduleChooser(sched), arrivals, cfg.max_batch)}
    out = {"shapes": shapes, "obs_spec": obs_spec, "reference": reference, "val_rates": rates,
           "schedule": [[lo, hi, step_shape.label(s)] for lo, hi, s in sched.ranges]}
    serve_policy = lambda policy: serve_tokens_per_s(val, lat, shapes, LearnedChooser(policy), arrivals, cfg.max_batch)
    if method != "resps":
        r = _one_thread(lambda: MODULES[method].train(env, mcfg, cfg.steps, cfg.seed, validate=serve_policy,
                                                      progress=cfg.progress, name=MANIFEST_METHOD[method]))
        return {**out, "policy": r["policy"], "history": r["history"], "val": r["best_val"], "algo": r["config"]}
    validate = lambda actor: serve_policy(make_policy(actor, shapes, cfg, obs_spec))
    r = _one_thread(lambda: ppo_train(env, replace(cfg.ppo, total_steps=cfg.steps, seed=cfg.seed), validate=validate,
                                      desc="resps-load", progress=cfg.progress, phase="resps-load"))
    return {**out, "actor": r["best_actor"], "history": r["history"], "val": r["best_val"], "algo": r["config"]}


def _one_thread(fn):
    """fn() with torch on one thread: these nets are tiny, and a second thread's hand-offs cost ~50x the
    maths on a busy machine (a 64-wide MLP's backward: ~75 ms on 2 threads, ~1 ms on 1)."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return fn()
    finally:
        torch.set_num_threads(n)


def save(out: Path, res: dict, cfg: LoadTrainConfig, training: dict) -> Path:
    method = resolve_method(cfg.method)
    if method != "resps":
        comps, shape = MODULES[method].components(res["policy"], getattr(cfg, method))
        return save_policy(out, out.name, MANIFEST_METHOD[method], comps, {"max_batch": cfg.max_batch, **shape}, training)
    spec = res["obs_spec"]
    return save_policy(out, out.name, "resps-load", {"shape": {
        "module": res["actor"], "net": mlp_spec(spec["dim"], cfg.ppo.actor_hidden, len(res["shapes"])),
        "obs": spec, "action": {"type": "serving_shape", "shapes": [step_shape.label(s) for s in res["shapes"]],
                                "hold": cfg.hold}}},
        {"max_batch": cfg.max_batch}, training)


def run_train_load_command(cfg: LoadTrainConfig) -> int:
    if not cfg.out:
        raise DraftGymError("--out is required")
    t0 = time.perf_counter()
    res = train_load(cfg)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    curve = out / "training_curve.png"
    method = resolve_method(cfg.method)
    name = MANIFEST_METHOD[method]
    plot_history(res["history"], curve, f"{name} (serving replay)")
    algo_key = "ppo" if method == "resps" else method
    summary = {"method": name, "out": str(out), "val_tokens_per_s": res["val"], "reference": res["reference"],
               "val_rates": res["val_rates"], "shapes": [step_shape.label(s) for s in res["shapes"]],
               "schedule_on_train": res["schedule"], "obs": res["obs_spec"],
               "config": {**asdict(cfg), algo_key: res["algo"]}, "curve": str(curve),
               "wall_s": time.perf_counter() - t0}
    save(out, res, cfg, summary)
    (out / "training.json").write_text(json.dumps({**summary, "history": res["history"]}, indent=1, default=str) + "\n")
    if cfg.as_json:
        print(json.dumps(summary, default=str))
        return 0
    ref = res["reference"]
    print(f"saved {name} policy to {out}: validation {res['val']:.1f} tokens/s under load (AR {ref['ar']:.1f}, "
          f"schedule {ref['schedule']:.1f}); {len(res['shapes'])} shapes, hold {cfg.hold}; "
          f"{summary['wall_s']:.0f} s; curve {curve}")
    return 0
