"""`draftgym train`: the one entry, `run_trainer`, of the three trainers (LTD, RADAR, Re-SpS).

The flow is the same for every method: load the train / val logs and the latency model, build the
method's config from `PolicyTrainConfig` (its TrainMethod.configure), train, plot the validation
curve, save the checkpoint and `training.json`. What differs per method is in its TrainMethod
(simulator/train/{ltd,radar,resps}.py: METHOD). `draftgym transfer` calls it once per profile.
"""
from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path

from pipeline.errors import DraftGymError
from simulator.methods.ltd import train as ltd
from simulator.methods.radar import train as radar
from simulator.methods.resps import train as resps
from simulator.train.common import (PolicyTrainConfig, TrainMethod, finish, load_training_data, logs_info,
                                    reference_speeds)
from simulator.train.ppo import plot_history

METHODS: dict[str, TrainMethod] = {"ltd": ltd.METHOD, "radar": radar.METHOD, "resps": resps.METHOD}


def run_trainer(cfg: PolicyTrainConfig) -> int:
    """Train cfg.method's policy into cfg.out (checkpoint, manifest.json, training.json, training_curve.png)
    and print its summary line (or the JSON summary)."""
    if cfg.method not in METHODS:
        raise DraftGymError(f"unknown training method {cfg.method!r} (known: {', '.join(METHODS)})")
    method = METHODS[cfg.method]
    t0 = time.perf_counter()
    data = load_training_data(cfg.logs, cfg.model, cfg.temperature, cfg.dataset, cfg.split, cfg.width,
                              widths="all" if method.all_widths else None, profile=cfg.profile,
                              latency_root=cfg.latency, dtype=cfg.dtype, latency_dtype=cfg.latency_dtype,
                              max_positions_in_memory=cfg.max_positions_in_memory, seed=cfg.seed, progress=cfg.progress)
    mcfg = method.configure(cfg, data)
    res = method.train(data, mcfg, progress=cfg.progress)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    curve = out / "training_curve.png"
    plot_history(res["history"], curve, f"{method.title} on {data.train.model} (replay)")
    summary = {"method": cfg.method, "out": str(out), **method.results(res),
               "reference": reference_speeds(data.val, data.latency), "config": asdict(mcfg),
               "logs": logs_info(data, cfg.logs), "curve": str(curve), "history": res["history"],
               "wall_s": time.perf_counter() - t0}
    method.save(out, res, mcfg, data, {k: v for k, v in summary.items() if k != "history"})
    return finish(out, summary, cfg.as_json)
