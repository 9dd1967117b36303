"""Spec-Bench-style timing of decoding methods on the real device.

For every run r = 1..runs, every prompt, every method: one generation, timed with a device sync
before each clock read (inside the engine). Per question: tokens/s = new tokens / wall time. Per
run: the mean over questions. Reported: mean and std over runs. speedup(method) = mean tokens/s of
the method / mean tokens/s of AR, with the same model, the same cache code and the same prompts.
At T = 0 every output is compared with AR's and classified exact / near-tie / mismatch
(pipeline/decode/lossless.py: strict in fp32; in bf16 a divergence at a rounding near-tie is allowed).
Warm-up generations come first.

`run_calls` is the one driver under it, under `validate --batch-sizes` (online/validate/batch.py)
and under `validate --load-trace` (online/validate/load.py): the same engine
(pipeline/decode/engine/core.py), the same calls, the same lossless references at every batch
size; the per-prompt timing is its calls of one prompt at B = 1, the per-B table its calls of a
queue of max(N, 2B) prompts at each B, the load trace one call per run with the trace's arrivals.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Callable

from tqdm import tqdm

from pipeline import metrics
from pipeline.decode.engine.core import BatchEngine
from pipeline.decode.controller import Controller
from pipeline.decode.engine.single import GenerationResult
from pipeline.decode.lossless import classify


@dataclass
class MethodRuns:
    """All generations of one method: results[run][prompt_index]."""

    name: str
    results: list[list[GenerationResult]] = field(default_factory=list)

    def per_run_tokens_per_s(self, idx: list[int] | None = None) -> list[float]:
        return [statistics.mean(r.tokens_per_s for i, r in enumerate(run) if idx is None or i in idx)
                for run in self.results]

    def generations(self, idx: list[int] | None = None) -> list[GenerationResult]:
        """Every run's results for the prompts in idx (all prompts when None)."""
        return [r for run in self.results for i, r in enumerate(run) if idx is None or i in idx]

    def tau(self, idx: list[int] | None = None) -> float | None:
        return metrics.tau_of_cycles(c for r in self.generations(idx) for c in r.cycles)

    def mean_depth(self, idx=None) -> float | None:
        cyc = [c for r in self.generations(idx) for c in r.cycles]
        return sum(c.depth for c in cyc) / len(cyc) if cyc else None

    def controller_share(self, idx=None) -> float:
        """Controller time as a fraction of decode wall time."""
        rs = self.generations(idx)
        wall = sum(r.wall_s for r in rs)
        return sum(c.t_controller for r in rs for c in r.cycles) / wall if wall else 0.0


@dataclass
class Call:
    """One generation call of the timed grid: `batch` rows (the most at once) decoding the prompts
    `requests` (indices into the prompt list; a queue when longer than the batch), one seed per
    request; optionally each request's arrival time (s from the call's start: served as traffic)
    and its own max_new_tokens."""

    batch: int
    requests: list[int]
    seeds: list[int]
    arrivals: list[float] | None = None
    max_new: list[int] | None = None


def run_calls(engine: BatchEngine, prompts: list[list[int]], methods: dict[str, Callable[[], Controller] | None],
              calls: Callable[[int], list[Call]], max_new_tokens: int, temperature: float = 0.0, runs: int = 3,
              progress: bool = True, before=None, after=None, warmup: str = "short") -> tuple[dict, list[tuple]]:
    """The one decoding driver of `draftgym validate`, at every batch size: for run r = 0..runs-1 and
    each Call of calls(r), every method decodes the call's requests in one generation, the methods
    rotated per run (run r starts at method r mod M, so none always decodes first or last).
    methods: name -> a controller factory (None = AR, every step off). Warm-up generations come
    first, untimed, per method: warmup "short", one of 8 tokens on the first call's first two
    requests; "full", every call of run 0 in full (what a server does before it serves: with CUDA
    graphs, the row counts, spans and shapes the calls visit are captured then, not in a timed run).

    Lossless (T = 0): every row is classified against its prompt's batch-1 AR output
    (pipeline/decode/lossless.py), taken from the AR method's own generation of that prompt at B = 1
    when one ran, else decoded once, untimed; the classification's extra forwards run between
    generations, in no clock. Hooks, in no generation's clock: before(call) runs before each method's
    generation, after(r, k) once every method has decoded call k of run r.

    Returns ({(r, k, method): BatchResult}, verdicts: (method, r, k, row j, prompt index, verdict))."""
    names = list(methods)
    if warmup not in ("short", "full"):
        raise ValueError(f"warmup must be 'short' or 'full', got {warmup!r}")
    warm = calls(0)[0]
    for name in names:
        if warmup == "full":
            for call in calls(0):
                _generate(engine, methods[name], call, prompts, call.max_new or [max_new_tokens] * len(call.requests),
                          temperature)
        else:
            _generate(engine, methods[name], Call(min(2, warm.batch), warm.requests[:2], warm.seeds[:2]), prompts,
                      [8] * len(warm.requests[:2]), temperature)
    refs: dict[tuple, list[int]] = {}         # (prompt, max_new) -> its batch-1 AR output
    ref_key = lambda i, m: (tuple(prompts[i]), m)

    def ref(i: int, m: int) -> list[int]:
        key = ref_key(i, m)
        if key not in refs:
            refs[key] = engine.generate_ar([prompts[i]], m, 0.0, 0, batch_size=1)[0].output_ids
        return refs[key]

    results, verdicts = {}, []
    plan = [calls(r) for r in range(runs)]
    bar = tqdm(total=sum(len(c) for c in plan) * len(names), desc="validate", unit="gen", disable=not progress)
    for r, calls_r in enumerate(plan):
        order = names[r % len(names):] + names[:r % len(names)]
        for k, call in enumerate(calls_r):
            max_new = call.max_new or [max_new_tokens] * len(call.requests)
            for name in order:
                if before is not None:
                    before(call)
                res = _generate(engine, methods[name], call, prompts, max_new, temperature)
                results[(r, k, name)] = res
                if temperature <= 0:
                    if methods[name] is None and call.batch == 1:
                        for i, m, row in zip(call.requests, max_new, res):
                            refs.setdefault(ref_key(i, m), row.output_ids)
                    verdicts += [(name, r, k, j, i, classify(engine.model, prompts[i], ref(i, m), row.output_ids))
                                 for j, (i, m, row) in enumerate(zip(call.requests, max_new, res))]
                bar.update(1)
            if after is not None:
                after(r, k)
    bar.close()
    return results, verdicts


def _generate(engine: BatchEngine, factory, call: Call, prompts, max_new, temperature):
    ids = [prompts[i] for i in call.requests]
    if factory is None:
        return engine.generate_ar(ids, max_new, temperature, call.seeds, batch_size=call.batch, arrivals=call.arrivals)
    return engine.generate(ids, max_new, temperature, call.seeds, batch_size=call.batch, controller=factory(),
                           arrivals=call.arrivals)


def run_methods(engine: BatchEngine, prompts: list[list[int]], methods: dict[str, Controller | None],
                max_new_tokens: int, temperature: float = 0.0, runs: int = 3, seed: int = 0,
                progress: bool = True, between=None) -> tuple[dict[str, MethodRuns], list[tuple]]:
    """The per-prompt timing above (Spec-Bench): run_calls with one call per prompt at batch 1, seed
    seed + 1000 r + i for prompt i. methods: name -> controller (None = AR). Returns (runs per method,
    lossless verdicts: one (name, run, prompt_index, LosslessVerdict) per non-AR generation at T = 0).
    between(run, prompt_index): called after every method has decoded that prompt (validate's
    interleaved profile rounds); its time is in no generation's clock."""
    calls = lambda r: [Call(1, [i], [seed + 1000 * r + i]) for i in range(len(prompts))]
    factories = {name: None if ctrl is None else (lambda c=ctrl: c) for name, ctrl in methods.items()}
    results, verdicts = run_calls(engine, prompts, factories, calls, max_new_tokens, temperature, runs, progress,
                                  after=between)
    out = {name: MethodRuns(name, [[GenerationResult.of_row(results[(r, i, name)])
                                    for i in range(len(prompts))] for r in range(runs)]) for name in methods}
    return out, [(name, r, i, v) for name, r, _, _, i, v in verdicts if methods[name] is not None]


def summarize(runs: dict[str, MethodRuns], idx: list[int] | None = None, baselines=("ar",)) -> dict:
    """Per method: tokens/s mean/std over runs, tau, mean depth, controller share, speedups."""
    tps = {n: m.per_run_tokens_per_s(idx) for n, m in runs.items()}
    mean = {n: statistics.mean(v) for n, v in tps.items()}
    out = {}
    for n, m in runs.items():
        out[n] = {"tokens_per_s": mean[n], "tokens_per_s_std": statistics.pstdev(tps[n]) if len(tps[n]) > 1 else 0.0,
                  "tau": m.tau(idx), "draft_calls_per_cycle": m.mean_depth(idx),
                  "controller_share": m.controller_share(idx)}
        for b in baselines:
            if b in mean:
                out[n][f"speedup_vs_{b}"] = metrics.speedup(mean[n], mean[b])
    return out


