"""`draftgym transfer`: hardware transfer from one set of acceptance logs and two latency profiles.

The claim it tests (docs/design.md, "Exact counterfactual replay"): acceptance is a property of the (target, head, prompts), time is a
property of the device, so a new device costs a latency profile, not a new collection. For each
profile P (a dtype of the logs' machine, or a profile id from another machine):

    1. train a policy on the logs' train split against P (`run_trainer`, as `draftgym train ... --latency-dtype P`)
    2. replay every trained policy on the test split under every profile Q

and report the 2 x 2 table  tokens/s(policy_P | Q) / tokens/s(grid-best_Q | Q), with grid-best_Q
the best static (D, W, V) on the val split under Q (the test split never picks anything), plus AR
and the hindsight oracle under Q for scale. The diagonal is "each policy on its own setting"; the
off-diagonal cells are the cross pairings. Online validation of the same pairings is
`draftgym validate --policy <out>/policy-<P> --dtype <Q> --logs-dtype <the logs' dtype>` (docs/policies.md).

Profile specs: float32 | bfloat16 | float16 (a dtype: that dtype's newest profile under the latency
root) or id:<profile_id> (any profile, e.g. one copied from another machine's logs/latency/).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from pipeline.cliargs import DTYPES
from pipeline.errors import DraftGymError
from simulator.logs.stream import DEFAULT_MAX_POSITIONS, LogSource
from simulator.train.common import PolicyTrainConfig


@dataclass
class TransferConfig:
    """`draftgym transfer`: a policy per latency profile from one set of logs, each replayed under every
    profile (the table vs grid-best). The training settings are `draftgym train`'s."""

    logs: str = ""                       # logs root: sequences/, positions/, latency/ (required)
    profiles: tuple = ()                 # two or more profile specs: a dtype (its newest profile) or id:<profile_id>
    method: str = ""                     # the policy to train: radar | ltd | resps (required)
    out: str = ""                        # directory: policy-<profile>/ per profile, transfer.{json,md,png} (required)
    model: str | None = None             # model partition; None: the only one
    dtype: str | None = None             # the logs' compute dtype; None: the only one
    temperature: float | None = None     # the logs' temperature partition; None: the only one
    latency: str | None = None           # root holding latency/; None: `logs`
    split: str = "test"                  # split the table is measured on (grid-best is picked on val)
    steps: int | None = None             # training budget, as `draftgym train --steps`
    seed: int = 0                        # training seed (the same for every profile)
    n_envs: int | None = None            # parallel replay environments, as `draftgym train`
    iters: tuple | None = None           # LTD: co-adaptation iterations, as `draftgym train`
    action_space: str = "wide"           # as `draftgym train` (wide: a CPU's best trees are small)
    obs: str = "paper"                   # observations, as `draftgym train`
    objective: str = "ratio"             # cycle reward, as `draftgym train` (rate: lambda is each profile's own grid-best)
    progress: bool = True                # progress bars
    max_positions_in_memory: int = DEFAULT_MAX_POSITIONS   # larger logs: a seeded window of this many positions


def train_config(cfg: TransferConfig) -> PolicyTrainConfig:
    """The training settings every profile's policy shares (its out and profile are set per profile)."""
    return PolicyTrainConfig(method=cfg.method, logs=cfg.logs, model=cfg.model, temperature=cfg.temperature,
                             dtype=cfg.dtype, latency=cfg.latency, steps=cfg.steps, seed=cfg.seed, n_envs=cfg.n_envs,
                             iters=cfg.iters, action_space=cfg.action_space, obs=cfg.obs, objective=cfg.objective,
                             progress=cfg.progress, max_positions_in_memory=cfg.max_positions_in_memory)


def train_flags(cfg: TransferConfig) -> list[str]:
    """The same settings as `draftgym train` flags (besides --logs, --method, --out and the profile): what
    transfer.json records, and what a finished policy must have been trained with to be reused."""
    flags = ["--seed", str(cfg.seed), "--action-space", cfg.action_space, "--obs", cfg.obs, "--objective", cfg.objective]
    for flag, v in (("--steps", cfg.steps), ("--n-envs", cfg.n_envs),
                    ("--iters", None if cfg.iters is None else ",".join(map(str, cfg.iters))),
                    ("--dtype", cfg.dtype), ("--latency", cfg.latency), ("--model", cfg.model),
                    ("--temperature", cfg.temperature)):
        if v is not None:
            flags += [flag, str(v)]
    if not cfg.progress:
        flags.append("--no-progress")
    return flags


def _latency(root, model, spec: str):
    from simulator.latency.model import LatencyModel

    if spec.startswith("id:"):
        return LatencyModel.from_logs(root, model=model, profile=spec[3:])
    if spec not in DTYPES:
        raise DraftGymError(f"profile spec {spec!r}: a dtype ({' | '.join(DTYPES)}) or id:<profile_id>")
    return LatencyModel.from_logs(root, model=model, dtype=spec)


def _profile_settings(spec: str) -> dict:
    """The PolicyTrainConfig fields that train against profile `spec`."""
    return {"profile": spec[3:]} if spec.startswith("id:") else {"latency_dtype": spec}


def _slug(spec: str) -> str:
    return spec.replace("id:", "").replace("/", "_")


def _train_record(train_args: list[str]) -> dict:
    """The `draftgym train` flags a finished policy must have been trained with to be reused."""
    return {k: v for k, v in zip(train_args, train_args[1:]) if k in ("--seed", "--obs", "--objective",
                                                                            "--action-space", "--steps", "--iters",
                                                                            "--temperature")}


def finished_policy(d: Path, method: str, logs: str, profile_id: str, train_args: list[str]) -> bool:
    """True when d holds a finished `draftgym train` run of this method on these logs against this
    profile with the same training flags (its training.json and transfer.json's record say so), so a
    re-run of `draftgym transfer` reuses it instead of training again (resumable, idempotent)."""
    tj, rec = d / "training.json", d / "transfer_train.json"
    if not (tj.is_file() and (d / "manifest.json").is_file() and rec.is_file()):
        return False
    try:
        t, r = json.loads(tj.read_text()), json.loads(rec.read_text())
    except (OSError, ValueError):
        return False
    return (t.get("method") == method and t.get("logs", {}).get("latency_profile") == profile_id
            and Path(str(t.get("logs", {}).get("root"))).resolve() == Path(logs).resolve()
            and r.get("flags") == _train_record(train_args))


def train_for_profiles(base: PolicyTrainConfig, specs: list[str], out: Path, train_args: list[str],
                       profile_ids: dict | None = None) -> dict:
    """One policy per profile by `run_trainer` (the same settings `base`, only the profile differs).
    A profile whose policy folder already holds a finished run with the same flags is not retrained."""
    from simulator.methods.run import run_trainer

    logs, method, dirs = base.logs, base.method, {}
    for spec in specs:
        d = out / f"policy-{_slug(spec)}"
        pid = (profile_ids or {}).get(spec)
        if pid is not None and finished_policy(d, method, logs, pid, train_args):
            print(f"[transfer] {d} is already trained against profile {pid} with these flags; reusing it "
                  f"(delete it to retrain)", flush=True)
        else:
            print(f"[transfer] training {method} against profile {spec} -> {d}", flush=True)
            run_trainer(replace(base, out=str(d), **_profile_settings(spec)))
            (d / "transfer_train.json").write_text(json.dumps({"profile_id": pid, "flags": _train_record(train_args)},
                                                              indent=2) + "\n")
        dirs[spec] = d
    return dirs


def load_transfer_logs(logs_root: str, split: str = "test", model: str | None = None, dtype: str | None = None,
                       temperature: float | None = None, max_positions_in_memory: int = DEFAULT_MAX_POSITIONS,
                       seed: int = 0):
    """The acceptance logs the table replays (a seeded window when larger than max_positions_in_memory),
    with a `split` to measure on: loaded before any training, so a wrong partition (model, dtype,
    temperature) or an empty split fails in one line first."""
    logs = LogSource(logs_root, model=model, dtype=dtype, temperature=temperature,
                     progress=False).sample(max_positions_in_memory, seed=seed)
    if logs.select(split).n_sequences == 0:
        raise DraftGymError(f"no {split!r} sequences under {logs_root}")
    return logs


def cross_table(logs, logs_root: str, policy_dirs: dict, specs: list[str], latency_root: str | None = None,
                split: str = "test") -> dict:
    """Replay each policy under each profile on `split` of `logs` (`load_transfer_logs`, from
    `logs_root`); grid-best picked on val under that profile."""
    from simulator import baselines
    from simulator.methods.checkpoint import load_checkpoint
    from simulator.replay import autoregressive, simulate

    test, val = logs.select(split), logs.select("val")
    tune = val if val.n_sequences else logs.select("train")
    cells, ref = {}, {}
    for q in specs:
        lat = _latency(latency_root or logs_root, logs.model, q)
        best = baselines.grid_search(tune, lat)["by_dataset"]["all"]["config"]
        tps = lambda pol: simulate(pol, test, lat).summary()["tokens_per_s"]
        ref[q] = {"profile_id": lat.meta.get("profile_id"), "device": lat.meta.get("device"),
                  "grid_best": list(best), "grid_best_tokens_per_s": tps(baselines.StaticPolicy(*best)),
                  "ar_tokens_per_s": autoregressive(test, lat).summary()["tokens_per_s"],
                  "oracle_tokens_per_s": tps(baselines.OraclePolicy(test, lat))}
        for p, d in policy_dirs.items():
            v = tps(load_checkpoint(d))
            cells[f"{p}|{q}"] = {"trained_on": p, "evaluated_on": q, "tokens_per_s": v,
                                 "vs_grid_best": v / ref[q]["grid_best_tokens_per_s"],
                                 "vs_ar": v / ref[q]["ar_tokens_per_s"]}
    return {"split": split, "sequences": int(test.n_sequences), "profiles": ref, "cells": cells}


def write_report(res: dict, specs: list[str], out: Path) -> None:
    """transfer.json, transfer.md (the 2 x 2 table) and transfer.png (bars per evaluation profile)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    (out / "transfer.json").write_text(json.dumps(res, indent=2) + "\n")
    lines = [f"Test split, {res['sequences']} sequences. Cell: replay tokens/s (x grid-best of the column's profile, "
             f"x AR).", "", "| trained on \\ evaluated on | " + " | ".join(specs) + " |",
             "|---" * (len(specs) + 1) + "|"]
    for p in specs:
        row = [res["cells"][f"{p}|{q}"] for q in specs]
        lines.append(f"| {p} | " + " | ".join(f"{c['tokens_per_s']:.2f} ({c['vs_grid_best']:.3f}x, {c['vs_ar']:.2f}x AR)"
                                              for c in row) + " |")
    for q in specs:
        r = res["profiles"][q]
        lines.append(f"| grid-best {tuple(r['grid_best'])} on {q} | " + " | ".join(
            f"{r['grid_best_tokens_per_s']:.2f}" if q2 == q else "" for q2 in specs) + " |")
    lines += ["", "AR / oracle under each profile: " + "; ".join(
        f"{q}: {res['profiles'][q]['ar_tokens_per_s']:.2f} / {res['profiles'][q]['oracle_tokens_per_s']:.2f} tokens/s"
        for q in specs)]
    (out / "transfer.md").write_text("\n".join(lines) + "\n")
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    x = np.arange(len(specs))
    wbar = 0.8 / (len(specs) + 1)
    for i, p in enumerate(specs):
        ax.bar(x + i * wbar, [res["cells"][f"{p}|{q}"]["vs_grid_best"] for q in specs], wbar, label=f"trained on {p}")
    ax.bar(x + len(specs) * wbar, [res["profiles"][q]["oracle_tokens_per_s"] / res["profiles"][q]["grid_best_tokens_per_s"]
                                   for q in specs], wbar, label="oracle", color="0.75")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(x + 0.4 - wbar / 2, [f"evaluated on {q}" for q in specs])
    ax.set_ylabel("tokens/s / grid-best (replay)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "transfer.png", dpi=110)
    plt.close(fig)


def run_transfer_command(cfg: TransferConfig) -> int:
    """`draftgym transfer`: check the profiles, train a policy per profile, replay the table, write the report."""
    specs = list(cfg.profiles)
    if len(specs) < 2 or len(set(specs)) != len(specs):
        raise DraftGymError("--profiles: two or more distinct profile specs, e.g. float32,bfloat16")
    tcfg = train_config(cfg)                          # the training settings' ranges, before the logs are read
    t0 = time.perf_counter()
    # the logs and every profile exist before any training starts
    logs = load_transfer_logs(cfg.logs, cfg.split, cfg.model, cfg.dtype, cfg.temperature, cfg.max_positions_in_memory,
                              cfg.seed)
    ids = {s: _latency(cfg.latency or cfg.logs, cfg.model, s).meta.get("profile_id") for s in specs}
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    train_args = train_flags(cfg)
    dirs = train_for_profiles(tcfg, specs, out, train_args, ids)
    res = cross_table(logs, cfg.logs, dirs, specs, cfg.latency, cfg.split)
    from pipeline.runtime.fingerprint import environment_fingerprint
    res.update(method=cfg.method, train_args=train_args, logs=cfg.logs, wall_s=time.perf_counter() - t0,
               date=time.strftime("%Y-%m-%d %H:%M:%S"), environment=environment_fingerprint("cpu"))
    write_report(res, specs, out)
    print((out / "transfer.md").read_text())
    return 0
