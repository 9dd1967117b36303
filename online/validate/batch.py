"""`draftgym validate --batch-sizes 1,4,16`: every method at every batch size B on this device, with
the batched engine (pipeline/decode/engine/core.py, continuous batching, one shape per step).

Methods: AR (every step off), each static shape of --shapes (trees "tree:D,W,V" and chains
"chain:K", spelled as `draftgym tune` spells them) and, with --schedule, a schedule JSON written by
`draftgym tune` (simulator/serving/schedule.py: the shape of the range holding the step's B). At
each B the requests are the dataset's prompts cycled to a queue of Q_B = max(N, 2 B) (so finished
rows are refilled); runs x B x methods generations, the methods interleaved within each run and B
(run r starts at method r mod M).

Metrics (defined once, per B and method):
  tokens/s              all new tokens / the call's wall time (every prefill and the drain
                        included), mean +- std over runs
  per-request tokens/s  a request's tokens after its prefill's / (end of its last step - start of its
                        first) on the step timeline (each step's t_step, then its refills' t_refill):
                        the decode rate the request saw, stalls for batch-mates' prefills included;
                        mean over requests and runs
  x AR                  tokens/s / AR's tokens/s at the same B
  tau                   tokens emitted in steps / row-steps (simulator/serving/metrics.py)
  drafts/step           draft tokens verified per row-step, V - 1 averaged (0 for an off step)
  held-B decode tokens/s  tokens / sum(t_step) over the leading steps while the batch is full (until
                        the queue runs dry and a row leaves): what a closed batch at B measures
  held tau              tau over the same steps: what the replay's tau is compared with
  lossless              T = 0: every row against its own batch-1 AR output (pipeline/decode/lossless.py:
                        fp32 exact or mismatch; reduced precision exact / near-tie / mismatch)
  replayed tokens/s     with --logs: simulator/serving/replay.py's closed batch at B over the logged
                        sequences of the same prompts (Q_B requests), timed by the logs' latency
                        profile at B; error = (replayed - held-B decode) / held-B decode. Needs a
                        profile taken with `draftgym profile --batch-sizes` and, for chains,
                        width-1 logs; what cannot be replayed gets a note instead.
  clock on its steps    with --logs: the clock's price of the device's own held-window steps (each
                        at its shape, B and step context) against their measured time, controller
                        calls left out (online/validate/sim_vs_real.py step_cost): the clock's share
                        of the replay error, the rest being the replay's path (its acceptance)

Written to --out: report.json, report.md, tokens_per_s_vs_batch.png and the step table
(pipeline/logs/schema.py BATCH_STEPS) under <out>/batch_steps/, one file per (dataset, B).
"""
from __future__ import annotations

import statistics
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from online.validate.batch_report import write_batch_markdown
from online.validate.common import BatchSizesConfig, check_config, load_prompt_sets, load_replay, print_report
from online.validate.interleave import BatchProfileSlices, slice_contexts, time_local_profile
from online.validate.sim_vs_real import step_cost
from online.validate.speedbench import Call, run_calls
from pipeline import metrics as pipeline_metrics
from pipeline.decode import step_shape
from pipeline.decode.controller import ScheduleController, StaticController
from pipeline.decode.engine.core import BatchEngine
from pipeline.decode.lossless import summarize_verdicts
from pipeline.decode.step_shape import StepShape
from pipeline.errors import DataError, DraftGymError
from pipeline.logs.schema import write_batch_steps
from pipeline.models.head import load_head_for
from pipeline.models.target import encode_prompt, load_target, resolve_dtype_name
from pipeline.runtime.atomic import atomic_write_json
from pipeline.runtime.fingerprint import device_name, environment_fingerprint
from simulator.serving import metrics
from simulator.serving.inputs import lookup_verify
from simulator.serving.replay import closed_batch, ShapeTable
from simulator.serving.schedule import Schedule

AR = "ar"
SCHEDULE = "schedule"


@dataclass
class Method:
    """One batched method: a static shape (canonical (D, W, V); off = AR) or a schedule."""

    name: str
    shape: tuple | None = None          # canonical (D, W, V); None for the schedule
    schedule: object = None             # simulator.serving.schedule.Schedule

    def factory(self):
        """The method's controller factory for online/validate/speedbench.py run_calls (None: AR)."""
        return None if self.name == AR else self.controller

    def controller(self):
        if self.schedule is None:
            return StaticController(StepShape(*self.shape))
        return ScheduleController(self.schedule.ranges)      # the same rule: beyond the last range, its shape

    def shape_at(self, batch: int) -> tuple:
        return self.shape if self.schedule is None else self.schedule.shape_for(batch)


def batch_methods(cfg: BatchSizesConfig) -> list[Method]:
    """AR, the --shapes in order, then the --schedule (one-line errors for bad spellings)."""
    out = [Method(AR, step_shape.OFF)]
    for spec in cfg.shapes:
        s = step_shape.parse(spec)
        if s == step_shape.OFF:
            raise DraftGymError("--shapes: 'off' is the AR method, which always runs")
        if step_shape.label(s) in [m.name for m in out]:
            raise DraftGymError(f"--shapes: {step_shape.label(s)} given twice")
        out.append(Method(step_shape.label(s), s))
    if cfg.schedule:
        out.append(Method(SCHEDULE, schedule=Schedule.load(cfg.schedule)))
    return out


def check_batch_config(cfg: BatchSizesConfig) -> None:
    """What `validate --batch-sizes` refuses up front, in one line, before any model loads."""
    check_config(cfg)
    if cfg.policies:
        raise DraftGymError("--policy runs at batch 1 only; at --batch-sizes give static --shapes or a --schedule")
    if cfg.profile_first:
        raise DraftGymError("--profile-first runs at batch 1 only; at --batch-sizes give --profile-interleave ROUNDS "
                            "(online/validate/interleave.py) or profile at B with `draftgym profile --batch-sizes` first")
    if not cfg.batch_sizes or min(cfg.batch_sizes) < 1:
        raise DraftGymError("--batch-sizes must be integers >= 1")
    batch_methods(cfg)


# ---------------------------------------------------------------------------------- one generation

def queue_length(n_prompts: int, batch: int) -> int:
    """Q_B = max(N, 2 B) requests at batch B: every prompt, and enough for every slot to be refilled."""
    return max(n_prompts, 2 * batch)


def step_timeline(res) -> np.ndarray:
    """[steps] start time of each step: the steps' t_step and t_refill laid end to end."""
    dur = np.array([s.t_step + s.t_refill for s in res.steps], np.float64)
    return np.concatenate([[0.0], np.cumsum(dur)[:-1]]) if len(dur) else dur


def per_request_tokens_per_s(res) -> list[float]:
    """Each request's decode rate as it saw it (module docstring); requests done at their prefill skipped."""
    start = step_timeline(res)
    out = []
    for r in res:
        if r.cycles:
            first, last = r.cycles[0].step, r.cycles[-1].step
            span = start[last] + res.steps[last].t_step - start[first]
            if span > 0:
                out.append(sum(c.emitted for c in r.cycles) / span)
    return out


def held_steps(res) -> list:
    """The leading steps while the batch is full (module docstring)."""
    if not res.steps:
        return []
    B = res.steps[0].batch_size
    return res.steps[:next((i for i, s in enumerate(res.steps) if s.batch_size != B), len(res.steps))]


def held_window(res) -> dict:
    """The held window's batch, steps, tokens and seconds."""
    steps = held_steps(res)
    return {"batch": steps[0].batch_size if steps else 0, "steps": len(steps),
            "tokens": sum(s.emitted_sum for s in steps), "seconds": sum(s.t_step for s in steps)}


def generation_figures(res) -> dict:
    """The figures of one batched generation that the report averages."""
    row_steps = sum(s.batch_size for s in res.steps)
    drafted = sum(s.batch_size * (s.verify_size - 1) for s in res.steps)
    emitted = sum(s.emitted_sum for s in res.steps)
    return {"tokens_per_s": res.tokens_per_s, "per_request": per_request_tokens_per_s(res),
            "tau": float(metrics.tau(emitted, row_steps)), "drafts_per_step": float(metrics.drafts_per_step(drafted, row_steps)),
            "held": held_window(res), "new_tokens": res.new_tokens, "wall_s": res.wall_s, "steps": len(res.steps)}


def step_table_rows(res, method: str, run: int, prompt_ids: list[str], device: str) -> list[dict]:
    """BATCH_STEPS rows of one generation (request k is prompt_ids[k])."""
    return [{"method": method, "run": run, "step": s.step, "batch": s.batch_size, "queue": s.queued,
             "depth": s.depth, "width": s.width, "verify_size": s.verify_size,
             "context_mean": float(np.mean(s.context_lens)), "context_max": int(max(s.context_lens)),
             "prompt_ids": [prompt_ids[r] for r in s.rows], "accepted": list(s.accepted),
             "emitted_sum": s.emitted_sum, "t_draft": s.t_draft, "t_verify": s.t_verify,
             "t_controller": s.t_controller, "t_step": s.t_step, "device": device} for s in res.steps]


# ---------------------------------------------------------------------------------- one dataset

@dataclass
class Cell:
    """All runs of one (B, method)."""

    figures: list[dict] = field(default_factory=list)
    verdicts: list = field(default_factory=list)        # (run, request, LosslessVerdict)
    held: list = field(default_factory=list)            # every run's held-window StepRecords (the clock's cost)


def run_dataset(cfg: BatchSizesConfig, recs, prompts: list[list[int]], engine, methods: list[Method],
                run_id: str, dev: str, progress: bool, between=None) -> tuple[dict, dict]:
    """Every method at every B, cfg.runs times, on the one driver (online/validate/speedbench.py run_calls: run
    r starts at method r mod M, so no method always decodes first or last; each row classified
    against its prompt's batch-1 AR output); the step table written per B. between(B), when given,
    runs before every method's generation (--profile-interleave's slices). Returns
    ({B: {method: Cell}}, {B: the step table's path})."""
    n = len(prompts)
    queues = [[k % n for k in range(queue_length(n, B))] for B in cfg.batch_sizes]   # the prompts cycled to Q_B

    def calls(r: int) -> list[Call]:                             # one call per B, the same queue every run
        return [Call(B, q, [cfg.seed + 1000 * r + k for k in range(len(q))]) for B, q in zip(cfg.batch_sizes, queues)]

    results, verdicts = run_calls(engine, prompts, {m.name: m.factory() for m in methods}, calls, cfg.max_new_tokens,
                                  cfg.temperature, cfg.runs, progress,
                                  before=None if between is None else (lambda call: between(call.batch)))
    cells = {B: {m.name: Cell() for m in methods} for B in cfg.batch_sizes}
    rows = {B: [] for B in cfg.batch_sizes}
    for (r, k, name), res in results.items():
        B = cfg.batch_sizes[k]
        cells[B][name].figures.append(generation_figures(res))
        cells[B][name].held += held_steps(res)
        rows[B] += step_table_rows(res, name, r, [recs[i].prompt_id for i in queues[k]], dev)
    for name, r, k, j, _, v in verdicts:
        cells[cfg.batch_sizes[k]][name].verdicts.append((r, j, v))
    paths = {B: str(write_batch_steps(cfg.out, cfg.model, recs[0].dataset, cfg.temperature, f"{run_id}-B{B}", rows[B]))
             for B in cfg.batch_sizes if rows[B]}
    return cells, paths


def summarize_cells(cells: dict, methods: list[Method], recs) -> dict:
    """{B: {method: figures}}: means over runs, x AR, lossless counts and divergences."""
    out = {}
    for B, by_method in cells.items():
        out[str(B)] = {}
        for m in methods:
            c = by_method[m.name]
            tps = [f["tokens_per_s"] for f in c.figures]
            per_req = [x for f in c.figures for x in f["per_request"]]
            held_tok = sum(f["held"]["tokens"] for f in c.figures)
            held_s = sum(f["held"]["seconds"] for f in c.figures)
            held_rs = sum(f["held"]["steps"] * f["held"]["batch"] for f in c.figures)
            s = {"shape": step_shape.label(m.shape_at(B)),
                 "tokens_per_s": statistics.mean(tps), "tokens_per_s_std": statistics.pstdev(tps) if len(tps) > 1 else 0.0,
                 "per_request_tokens_per_s": statistics.mean(per_req) if per_req else None,
                 "tau": statistics.mean(f["tau"] for f in c.figures),
                 "drafts_per_step": statistics.mean(f["drafts_per_step"] for f in c.figures),
                 "held_batch": c.figures[0]["held"]["batch"],
                 "held_decode_tokens_per_s": held_tok / held_s if held_s > 0 else None,
                 "held_tau": float(metrics.tau(held_tok, held_rs)) if held_rs else None,
                 "new_tokens": sum(f["new_tokens"] for f in c.figures), "requests": queue_length(len(recs), B)}
            if c.verdicts:
                summ = summarize_verdicts([v for *_, v in c.verdicts])
                s["lossless"] = summ["counts"]
                s["divergences"] = [{"run": r, "request": k, "prompt_id": recs[k % len(recs)].prompt_id, **v.to_dict()}
                                    for r, k, v in c.verdicts if v.status != "exact"]
            out[str(B)][m.name] = s
        ar = out[str(B)][AR]["tokens_per_s"]
        for s in out[str(B)].values():
            s["speedup_vs_ar"] = pipeline_metrics.speedup(s["tokens_per_s"], ar)
    return out


# ---------------------------------------------------------------------------------- the simulator's side

def replay_side(cfg: BatchSizesConfig, logs, clocks: dict, recs, methods: list[Method], by_batch: dict,
                cells: dict) -> dict:
    """Replayed tokens/s of a closed batch at each B against the held-B decode tokens/s measured
    (module docstring), once per clock: clocks = {suffix: LatencyModel} ("" for the report's main
    columns). Adds `replayed_tokens_per_s<suffix>` and `replay_rel_error<suffix>` per clock, and
    `replayed_tau` and `replay_tau_rel_error` (the replay's tau against the device's over the same
    held-B window; no clock changes it) to by_batch's rows, and `cost_rel_error<suffix>`: the clock's
    price of the device's own held-window steps against their measured time (online/validate/
    sim_vs_real.py step_cost: the clock's share of the error); returns the notes of what could not
    be replayed."""
    ids = [r.prompt_id for r in recs]
    first = {}                                       # each prompt's first logged sequence
    for k, pid in enumerate(logs.prompt_id.tolist()):
        first.setdefault(pid, k)
    ev = logs.subset(np.array([first[i] for i in ids if i in first], np.int64))   # in the device's queue order
    ev = replace(ev, new_tokens=np.minimum(ev.new_tokens, cfg.max_new_tokens))    # cut where the device cuts
    if ev.n_sequences == 0:
        return {"note": f"no logged sequences for these prompts in {cfg.logs} (collect them first)"}
    notes = {"missing_prompts": sorted(set(ids) - set(ev.prompt_id.tolist())), "not_replayable": {}}
    for B in cfg.batch_sizes:
        ok = {}
        for m in methods:
            try:
                lookup_verify(ev, m.shape_at(B))
                ok[m.name] = step_shape.canonical(m.shape_at(B))
            except DataError as e:
                notes["not_replayable"][f"{m.name} at B = {B}"] = str(e)
        shapes = list(dict.fromkeys(ok.values()))
        table = ShapeTable(ev, shapes)
        for suffix, lat in clocks.items():
            try:
                res = closed_batch(ev, lat, table, B, n_requests=queue_length(len(recs), B))
            except DataError as e:
                notes.setdefault("batch", {})[str(B)] = str(e)
                break
            for m in methods:
                by_batch[str(B)][m.name]["cost_rel_error" + suffix] = step_cost(cells[B][m.name].held, lat)["rel_error"]
            for name, s in ok.items():
                row = by_batch[str(B)][name]
                sim = float(res["tokens_per_s"][shapes.index(s)])
                real = row["held_decode_tokens_per_s"]
                row["replayed_tokens_per_s" + suffix] = sim
                row["replay_rel_error" + suffix] = pipeline_metrics.rel_error(sim, real)
                if row.get("held_tau"):
                    tau = float(res["tau"][shapes.index(s)])
                    row["replayed_tau"], row["replay_tau_rel_error"] = tau, pipeline_metrics.rel_error(tau, row["held_tau"])
    return notes


# ---------------------------------------------------------------------------------- the command

def interleave_slices(cfg: BatchSizesConfig, methods: list[Method], engine, tokenizer, encoded: dict):
    """--profile-interleave ROUNDS at --batch-sizes: the slices (online/validate/interleave.py) over the
    shapes the methods run at each B and the contexts of every dataset's prompts; None without it."""
    if not cfg.profile_interleave:
        return None

    shapes_at = {B: sorted({step_shape.canonical(m.shape_at(B)) for m in methods}) for B in cfg.batch_sizes}
    contexts = slice_contexts([p for ps in encoded.values() for p in ps], cfg.max_new_tokens,
                              engine.model.config.max_position_embeddings)
    return BatchProfileSlices(engine, tokenizer, shapes_at, contexts, cfg.profile_interleave)


def run_validate_batch(cfg: BatchSizesConfig, progress: bool = True) -> dict:
    """Every method at every B on every dataset's prompts; report.json, report.md, the PNG and the
    step tables go to cfg.out, and the report is returned."""
    t_start = time.perf_counter()
    methods = batch_methods(cfg)
    dtype = resolve_dtype_name(cfg.dtype, cfg.device)
    prompt_sets = load_prompt_sets(cfg)
    target = load_target(cfg.model, device=cfg.device, dtype=dtype)
    head = load_head_for(cfg.head, target.model, cfg.seed)
    engine = BatchEngine(target.model, head, target.eos_token_ids)
    dev = device_name(target.device, dtype)
    logs, lat, replay_note = load_replay(cfg, dev, dtype, [r.prompt_id for recs in prompt_sets.values() for r in recs])
    run_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    report = {"run_id": run_id, "config": asdict(cfg), "device": dev, "dtype": dtype,
              "environment": environment_fingerprint(target.device, dtype), "head_id": head.head_id,
              "batch_sizes": list(cfg.batch_sizes), "methods": [m.name for m in methods],
              "schedule": methods[-1].schedule.table() if cfg.schedule else None,
              "replay_note": replay_note, "datasets": {}, "command": " ".join(sys.argv)}
    encoded = {ds: [encode_prompt(target.tokenizer, list(r.messages)) for r in prompt_sets[ds]] for ds in cfg.datasets}
    slices = interleave_slices(cfg, methods, engine, target.tokenizer, encoded) if logs is not None else None
    all_cells = {}
    for ds in cfg.datasets:
        recs, prompts = prompt_sets[ds], encoded[ds]
        cells, paths = run_dataset(cfg, recs, prompts, engine, methods, run_id, dev, progress, between=slices)
        all_cells[ds] = cells
        by_batch = summarize_cells(cells, methods, recs)
        counts = summarize_verdicts([v for c in cells.values() for cell in c.values() for *_, v in cell.verdicts])
        report["datasets"][ds] = {
            "prompts": [r.prompt_id for r in recs], "by_batch": by_batch, "step_tables": {str(B): p for B, p in paths.items()},
            "lossless_checked": cfg.temperature <= 0, "lossless": cfg.temperature > 0 or counts["ok"],
            "lossless_counts": counts["counts"] if cfg.temperature <= 0 else None}
    if logs is not None:
        clocks = {"": lat}
        if slices is not None:                       # the time-local profile; the logs' own: the second column
            local, report["profile_interleave"] = time_local_profile(slices, engine, cfg.logs, lat.meta["profile_id"],
                                                                     logs.model, cfg.out, dev, dtype)
            clocks = {"": local, "_logs_profile": lat}
        for ds in cfg.datasets:
            e = report["datasets"][ds]
            e["replay"] = replay_side(cfg, logs, clocks, prompt_sets[ds], methods, e["by_batch"], all_cells[ds])
    report["wall_s"] = time.perf_counter() - t_start
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(report, out / "report.json")
    write_batch_markdown(report, out)
    return report


def run_validate_batch_command(cfg: BatchSizesConfig) -> int:
    """`draftgym validate --batch-sizes ...`: check the settings, run, print the report. Exit status 1
    when a row at T = 0 was not lossless against its batch-1 AR output."""
    check_batch_config(cfg)
    return print_report(cfg, run_validate_batch(cfg, progress=cfg.progress))
