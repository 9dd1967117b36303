"""`draftgym validate`: policies in the loop on the real device, against AR, the static EAGLE-3
default and the grid-best static config, with a sim-vs-real report.

For each dataset (test split, first N prompts) and each run, every method decodes every prompt
(methods interleaved per prompt; Spec-Bench timing, see `online.validate.speedbench`). At T = 0 every
output is checked against AR. Every cycle goes to `<out>/cycles/...parquet` (schema `cycles`).

Metrics (definitions stated once):
  tokens/s          new tokens / wall time per prompt (prefill included), mean over prompts, then
                    mean +- std over runs
  speedup vs X      tokens/s(method) / tokens/s(X), same prompts, same runs
  tau               sum(emitted) / cycles (vLLM's mean acceptance length)
  draft calls/cycle mean D actually drafted
  controller %      sum(t_controller) / sum(wall)
  sim-vs-real       the simulator replays the same policy on the logged sequences of the same
                    prompts (same model, head, temperature) with the device's latency profile.
                    Compared quantities are cycle-only: tau, and decode tokens/s =
                    sum(emitted) / sum(t_cycle) per prompt (the simulator has no prefill).
                    Error = (sim - real) / real. At T = 0 also re-anchored (online/validate/reanchor.py): each
                    method replayed on its own decoded text, which in bf16 leaves the logged text
                    at the first near-tie; that error is the simulator's alone.
"""
from __future__ import annotations

import statistics
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from online.adapters.specs import make_controller, policy_label
from online.policy_cost import copy_policy_rows, profile_policies
from online.validate.common import Batch1Config, check_config, load_acceptance_logs, load_prompt_sets, print_report
from online.validate.reanchor import reanchor_for_validate
from online.validate.report import write_markdown
from online.validate.sim_vs_real import decode_tokens_per_s, sim_vs_real
from online.validate.speedbench import run_methods, summarize
from pipeline.datasets import resolve_split
from pipeline.decode.controller import StaticController
from pipeline.decode.engine.core import BatchEngine
from pipeline.decode.engine.single import Engine
from pipeline.decode.lossless import summarize_verdicts
from pipeline.decode.step_shape import EAGLE3_DEFAULT_SHAPE
from pipeline.errors import DraftGymError
from pipeline.logs.schema import CYCLES, partition_dir, SCHEMA_VERSION, write_atomic
from pipeline.models.head import load_head_for
from pipeline.models.target import encode_prompt, load_target, resolve_dtype_name
from pipeline.profiling.profile import ProfileSampler
from pipeline.runtime.atomic import atomic_write_json
from pipeline.runtime.fingerprint import device_name, environment_fingerprint
from simulator import baselines
from simulator.evaluate import grid_part, grid_search_parts, pick_tune_split
from simulator.latency.estimate import POINTS
from simulator.latency.model import LatencyModel
from simulator.methods.checkpoint import load_checkpoint
from simulator.policy_specs import CHECKPOINT, parse_spec

if TYPE_CHECKING:
    from simulator.logs.replay_logs import ReplayLogs


@dataclass
class SimSide:
    """The simulator's side of a validation (with --logs): what grid-best and sim-vs-real replay."""

    logs: ReplayLogs                      # the acceptance logs of the decoding's model and temperature
    lat: LatencyModel                     # what grid-best and the online policies were chosen / built with
    clock: LatencyModel                   # what sim-vs-real is timed with: `lat`, or the pooled profile of
                                          # --profile-interleave
    grid: dict                            # dataset -> grid-best static (D, W, V) on the tune split ("all": every dataset)
    note: str | None = None               # why there is no sim-vs-real (T > 0 without logs at T), else None
    local: dict = field(default_factory=dict)   # dataset -> (clock rescaled to the speed seen while it
                                                # decoded, (factor, cells)); --profile-interleave only
    clock_root: str | None = None         # the logs root holding `clock`'s profile (its id in clock.meta)
    at_points: dict = field(default_factory=dict)   # dataset -> {point: clock}: clocks_at_points' cache

    def grid_best(self, ds: str) -> tuple:
        return self.grid.get(ds, self.grid["all"])

    def clocks_at_points(self, ds: str) -> dict:
        """{point: dataset ds's sim-vs-real clock with its cells priced at that statistic}
        (simulator/latency/estimate.py; rescaled like the clock under --profile-interleave); {} for a
        clock not read from a profile (no clock_root)."""
        if self.clock_root is None:
            return {}
        if ds not in self.at_points:
            meta, local = self.clock.meta, self.local.get(ds)
            at = {p: LatencyModel.from_logs(self.clock_root, model=meta["model_id"], profile=meta["profile_id"],
                                            device=meta["device"], dtype=meta["dtype"], point=p) for p in POINTS}
            self.at_points[ds] = {p: lat.scaled(local[1][0]) if local else lat for p, lat in at.items()}
        return self.at_points[ds]


class InterleavedProfile:
    """--profile-interleave: `rounds` further profile rounds spread over the decoding. Called after each
    generation slot (a prompt decoded by every method: run_methods' `between` hook): after slot j of n
    the sampler has run base + ceil(total * j / n) jobs (a job: one context's generation,
    pipeline/profiling/profile.py ProfileSampler), so its samples cover the same stretch of time as
    the decoding."""

    def __init__(self, sampler, rounds: int, slots: int):
        self.sampler = sampler
        self.slots = slots                       # n = datasets x runs x prompts per dataset
        self.total = rounds * len(sampler.jobs)  # jobs to run over the decoding
        self.base = sampler.done                 # jobs run before it (the --profile-first round)
        self.slots_done = 0

    def __call__(self, *_) -> None:
        self.slots_done += 1
        want = self.base + -(-self.total * min(self.slots_done, self.slots) // self.slots)
        if want > self.sampler.done:
            self.sampler.step(want - self.sampler.done)

    def finish(self) -> None:
        """Run the jobs the decoding left (fewer slots than planned: datasets shorter than n_prompts)."""
        if self.sampler.done - self.base < self.total:
            self.sampler.step(self.base + self.total - self.sampler.done)


def cycle_rows(run_id: str, method: str, prompt_id: str, run: int, res, device: str) -> list[dict]:
    rows, p = [], 0
    for i, c in enumerate(res.cycles):
        rows.append({"schema_version": SCHEMA_VERSION, "run_id": run_id, "method": method, "prompt_id": prompt_id,
                     "run": run, "cycle": i, "position": p, "context_len": c.context_len, "depth": c.depth,
                     "width": c.width, "verify_size": c.verify_size, "accepted": c.accepted, "emitted": c.emitted,
                     "t_draft": c.t_draft, "t_verify": c.t_verify, "t_controller": c.t_controller,
                     "t_cycle": c.t_cycle, "device": device})
        p += c.emitted
    return rows


def run_validate(cfg: Batch1Config, progress: bool = True) -> dict:
    """Every method decodes every dataset's prompts on this device; the report (report.json,
    report.md, cycles Parquet) goes to cfg.out and is returned."""
    out = Path(cfg.out)
    t_start = time.perf_counter()
    dtype = resolve_dtype_name(cfg.dtype, cfg.device)     # decoding and profile must be of this dtype
    # the logs too, unless --logs-dtype says otherwise: acceptance moves little between dtypes (near-ties),
    # the clock moves a lot, so logs of one dtype with a profile of another is the transfer setting
    logs_dtype = resolve_dtype_name(cfg.logs_dtype, cfg.device) if cfg.logs_dtype else dtype
    prompt_sets = load_prompt_sets(cfg)                # a bad dataset or split fails before any model loads,
    logs, note, source = load_acceptance_logs(cfg, logs_dtype,   # and so does a bad --logs
                                              [r.prompt_id for recs in prompt_sets.values() for r in recs])

    target = load_target(cfg.model, device=cfg.device, dtype=dtype)
    head = load_head_for(cfg.head, target.model, cfg.seed)
    core = BatchEngine(target.model, head, target.eos_token_ids)    # the methods decode on it (run_methods)
    engine = Engine.on(core)                                       # profile-first and re-anchoring: batch-1 calls
    dev = device_name(target.device, dtype)
    run_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    report = {"run_id": run_id, "config": asdict(cfg), "device": dev, "dtype": dtype,
              "logs_dtype": logs_dtype if logs is not None else None,
              "environment": environment_fingerprint(target.device, dtype),
              "head_id": head.head_id, "datasets": {}, "command": " ".join(sys.argv)}
    labels = [policy_label(p) for p in cfg.policies]
    if len(set(labels)) != len(labels):
        raise DraftGymError(f"policy names repeat: {labels}")

    sim = interleave = None
    if logs is not None:
        sim, interleave = simulator_side(cfg, logs, source, note, engine, target.tokenizer, dev, dtype, report,
                                         progress)
    pending = []                                     # (entry, records, runs) of the datasets sim-vs-real compares
    for ds in cfg.datasets:
        entry, runs = validate_dataset(cfg, ds, prompt_sets[ds], core, target.tokenizer, sim, labels, interleave,
                                       run_id, dev, progress)
        report["datasets"][ds] = entry
        if sim:
            pending.append((entry, prompt_sets[ds], runs))
    if interleave is not None:
        pool_interleaved_profile(cfg, sim, interleave, report, dev, dtype)
    for entry, recs, runs in pending:                # after all decoding: the clock may be the pooled profile
        own = reanchor_for_validate(cfg, sim, engine, head, recs, runs, dtype, run_id)  # own texts' logs (or None)
        entry["sim_vs_real"] = {"note": sim.note} if sim.note else sim_vs_real(cfg, sim, recs, runs, labels, own)
    report["wall_s"] = time.perf_counter() - t_start
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(report, out / "report.json")
    write_markdown(report, out)
    return report


def simulator_side(cfg: Batch1Config, logs, source, note, engine, tokenizer, dev: str, dtype: str, report: dict,
                   progress: bool):
    """(SimSide, InterleavedProfile or None): this device's latency profile (fresh with --profile-first,
    recorded in `report`) and the grid-best configs it picks on the tune split (streamed over `source`, a
    LogSource, when the logs did not fit: then `logs` is a window)."""
    lat_root, interleave = cfg.logs, None
    if cfg.profile_first or cfg.profile_interleave:
        report["profile_first"], sampler = profile_first(cfg, engine, tokenizer, Path(cfg.out), progress)
        lat_root = cfg.out
        if cfg.profile_interleave:
            interleave = InterleavedProfile(sampler, cfg.profile_interleave,
                                            len(cfg.datasets) * cfg.runs * cfg.n_prompts)
    lat = LatencyModel.from_logs(lat_root, model=logs.model, device=dev, dtype=dtype)
    report["latency_profile"] = profile_entry(lat_root, lat)
    tune = pick_tune_split(logs.split if source is None else source.sel.splits,
                           resolve_split(cfg.datasets[0], cfg.split) or "test", "auto")
    if source is None:
        gs = baselines.grid_search(logs.select(tune), lat)
    else:
        space, budget = baselines.static_space(source.sel), cfg.max_positions_in_memory
        gs = grid_search_parts((grid_part(c, tune, lat, space) for c in source.chunks(budget, "grid search", scores=False)),
                               space)
    grid = {d: tuple(v["config"]) for d, v in gs["by_dataset"].items()}
    return SimSide(logs=logs, lat=lat, clock=lat, grid=grid, note=note, clock_root=str(lat_root)), interleave


def validate_dataset(cfg: Batch1Config, ds: str, recs, core, tokenizer, sim: SimSide | None, labels,
                     interleave: InterleavedProfile | None, run_id: str, dev: str, progress: bool):
    """Every method decodes `recs` on the engine `core` (cfg.runs times, methods interleaved per prompt); the cycles go to
    Parquet. Returns (the report entry of this dataset, the runs per method)."""
    prompts = [encode_prompt(tokenizer, list(r.messages)) for r in recs]
    if interleave is not None:
        interleave.sampler.segment = ds              # the profile samples taken while this dataset decodes
    methods = {"ar": None, "static": StaticController(*EAGLE3_DEFAULT_SHAPE)}
    if sim:
        methods["grid-best"] = StaticController(*sim.grid_best(ds))
    for spec, label in zip(cfg.policies, labels):
        methods[label] = make_controller(spec, logs=sim and sim.logs, latency=sim and sim.lat)
    runs, verdicts = run_methods(core, prompts, methods, cfg.max_new_tokens, cfg.temperature, cfg.runs,
                                 cfg.seed, progress=progress, between=interleave)
    rows = [row for name, m in runs.items() if name != "ar" for r, run in enumerate(m.results)
            for rec, res in zip(recs, run) for row in cycle_rows(run_id, name, rec.prompt_id, r, res, dev)]
    if rows:
        path = partition_dir(cfg.out, "cycles", cfg.model, ds, cfg.temperature) / f"{run_id}.parquet"
        write_atomic(pa.Table.from_pylist(rows, schema=CYCLES), path, "cycles")
    summ = summarize(runs, baselines=("ar", "static") + (("grid-best",) if sim else ()))
    for name, m in runs.items():
        if name != "ar" and cfg.temperature <= 0:
            summ[name]["lossless"] = summarize_verdicts([v for n, _, _, v in verdicts if n == name])["counts"]
        dec = [decode_tokens_per_s(res) for run in m.results for res in run]
        dec = [d for d in dec if d is not None]
        summ[name]["decode_tokens_per_s"] = statistics.mean(dec) if dec else None
    lossless = summarize_verdicts([v for *_, v in verdicts])
    entry = {"prompts": [r.prompt_id for r in recs], "methods": summ,
             "lossless": cfg.temperature > 0 or lossless["ok"], "lossless_checked": cfg.temperature <= 0,
             "lossless_counts": lossless["counts"] if cfg.temperature <= 0 else None,
             "divergences": [{"method": n, "run": r, "prompt_id": recs[i].prompt_id, **v.to_dict()}
                             for n, r, i, v in verdicts if v.status != "exact"]}
    if sim:
        entry["grid_best"] = list(sim.grid_best(ds))
    return entry, runs


def pool_interleaved_profile(cfg: Batch1Config, sim: SimSide, interleave: InterleavedProfile, report: dict,
                             dev: str, dtype: str) -> None:
    """After the decoding: the interleaved rounds written as one pooled profile, which becomes the
    sim-vs-real clock, and per dataset that clock rescaled by the speed the profile's own samples saw
    while the dataset decoded (LatencyModel.scaled); the pooled clock's error stays in the report as a
    second column."""
    t0 = time.perf_counter()
    sampler = interleave.sampler
    sampler.segment = "after"
    interleave.finish()
    info = sampler.write(cfg.out)
    copy_policy_rows(cfg.out, cfg.model, report["profile_first"]["profile_id"], info["profile_id"])
    sim.clock = LatencyModel.from_logs(cfg.out, model=sim.logs.model, device=dev, profile=info["profile_id"],
                                       dtype=dtype)
    sim.clock_root = str(cfg.out)
    sim.local = {ds: (sim.clock.scaled(sf[0]), sf) for ds in cfg.datasets
                 if (sf := sampler.speed_factor(ds)) is not None}
    report["profile_interleave"] = {"profile_id": info["profile_id"], "rounds": info["rounds"],
                                    "jobs": info["jobs"], "final_s": time.perf_counter() - t0}
    report["latency_profile"] = profile_entry(cfg.out, sim.clock)


def profile_entry(root, lat) -> dict:
    """The report's `latency_profile`: where the clock's profile is, its id, the cell statistic it
    prices and the suspect cells it left out (one line, or None)."""
    return {"root": str(root), "profile_id": lat.meta.get("profile_id"), "point": lat.meta.get("point"),
            "trust_note": lat.meta.get("trust_note")}


def profile_first(cfg: Batch1Config, engine, tokenizer, out: Path, progress: bool = True):
    """`--profile-first`: profile this engine in situ into `<out>/latency`, then time each checkpoint
    policy's controller calls into the same profile, right before decoding. Why: on a shared VM the
    machine's speed can drift 1.5-1.7x within an hour, and a profile taken in another
    state mis-predicts every method by that ratio. Returns (info, the sampler,
    whose further rounds `--profile-interleave` spreads over the decoding)."""
    t0 = time.perf_counter()
    sampler = ProfileSampler(engine, tokenizer, cfg.model, verify_sizes=cfg.profile_verify_sizes,
                             contexts=cfg.profile_contexts, repeats=cfg.profile_repeats)
    sampler.run_round(progress)
    info = sampler.write(str(out))
    ckpts = [(spec, load_checkpoint(spec)) for spec in cfg.policies if parse_spec(spec)[0] == CHECKPOINT]
    if ckpts:
        profile_policies(engine, tokenizer, ckpts, str(out), cfg.model, progress=progress)
    return ({"profile_id": info["profile_id"], "path": info["path"], "policies_timed": len(ckpts),
             "wall_s": time.perf_counter() - t0}, sampler)


def run_validate_batch1_command(cfg: Batch1Config) -> int:
    """`draftgym validate`: check the settings, `run_validate`, print the report. Exit status 1 when
    an output at T = 0 was not lossless."""
    check_config(cfg)
    return print_report(cfg, run_validate(cfg, progress=cfg.progress))
