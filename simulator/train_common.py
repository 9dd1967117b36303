"""What the three trainers share: loading train/val logs + latency, validation, greedy wrappers, output."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.errors import DataError
from simulator.latency import LatencyModel
from simulator.logs import ReplayLogs, load_logs


@dataclass
class TrainData:
    train: ReplayLogs
    val: ReplayLogs          # the val split, or train when there is none (noted)
    latency: LatencyModel
    notes: list


def load_training_data(logs_root, model=None, temperature=None, datasets=None, split: str = "train",
                       width: int | None = None, widths=None, profile=None, latency_root=None,
                       dtype: str | None = None, latency_dtype: str | None = None) -> TrainData:
    logs = load_logs(logs_root, model=model, temperature=temperature, datasets=datasets, width=width, widths=widths,
                     dtype=dtype)
    lat = LatencyModel.from_logs(latency_root or logs_root, model=logs.model, profile=profile,
                                 dtype=latency_dtype or logs.dtype)
    train = logs.select(split)
    if train.n_sequences == 0:
        raise DataError(f"no sequences in training split {split!r} (splits: {sorted(set(logs.split.tolist()))})")
    notes = list(logs.notes)
    val = logs.select("val")
    if val.n_sequences == 0 or split == "val":
        val = train
        notes.append("no val split: validating on the training split")
    return TrainData(train, val, lat, notes)


def greedy(net):
    """numpy obs -> argmax action (for frozen partner policies inside an env)."""
    from simulator.nets import torch_logits

    return lambda o: torch_logits(net, o).argmax(-1)


def replay_tokens_per_s(policy, logs: ReplayLogs, lat: LatencyModel) -> float:
    from simulator.replay import simulate

    return simulate(policy, logs, lat).summary()["tokens_per_s"]


def resolve_verify_size(args, data: "TrainData", default: int) -> int:
    """V for the fixed-V phases (RADAR; LTD's depth policy in Iter0).

    --verify-size N wins; with --action-space wide and no N, the V of the grid-best static config on
    the training split under this latency model (on a CPU a small tree; the seeds' 60 on a GPU-like
    profile); otherwise the seeds' default (60). Must be on the logged V grid (exact replay)."""
    v = getattr(args, "verify_size", None)
    if v is None and getattr(args, "action_space", "seeds") == "wide":
        from simulator.baselines import grid_search
        v = grid_search(data.train, data.latency)["by_dataset"]["all"]["config"][2]
    v = default if v is None else int(v)
    try:
        data.train.grid_index(v)               # replay is exact only on the logged grid
    except ValueError as e:
        from pipeline.errors import DraftGymError
        raise DraftGymError(f"--verify-size: {e}") from None
    return v


def reference_speeds(logs: ReplayLogs, lat: LatencyModel) -> dict:
    from simulator import baselines as B
    from simulator.replay import autoregressive

    return {"ar": autoregressive(logs, lat).summary()["tokens_per_s"],
            "static": replay_tokens_per_s(B.StaticPolicy(*B.default_static(logs)), logs, lat)}


def logs_info(data: TrainData, root) -> dict:
    return {"root": str(root), "model": data.train.model, "temperature": data.train.temperature,
            "train_sequences": data.train.n_sequences, "val_sequences": data.val.n_sequences,
            "datasets": data.train.datasets, "latency_profile": data.latency.meta.get("profile_id"),
            "notes": data.notes}


def finish(out, summary: dict, as_json: bool) -> int:
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / "training.json").write_text(json.dumps(summary, indent=2, default=_default) + "\n")
    if as_json:
        print(json.dumps(summary, default=_default))
    else:
        print(f"saved {summary['method']} policy to {out}: validation {summary['val_tokens_per_s']:.2f} tokens/s "
              f"(AR {summary['reference']['ar']:.2f}, static {summary['reference']['static']:.2f}) "
              f"in {summary['wall_s']:.0f} s; curve {summary.get('curve')}")
    return 0


def _default(o):
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    if hasattr(o, "tolist"):
        return o.tolist()
    return str(o)


def resolve_rate_ref(args, data: "TrainData") -> float:
    """lambda for --objective rate (simulator/env_core.py, OBJECTIVES): grid-best's replay tokens/s on
    the training split under this latency model, i.e. the rate the policy has to beat. 0 for ratio."""
    if getattr(args, "objective", "ratio") != "rate":
        return 0.0
    from simulator.baselines import grid_search
    return float(grid_search(data.train, data.latency)["by_dataset"]["all"]["tokens_per_s"])
