"""Spec-Bench-style timing of decoding methods on the real device.

For every run r = 1..runs, every prompt, every method: one generation, timed with a device sync
before each clock read (inside the engine). Per question: tokens/s = new tokens / wall time. Per
run: the mean over questions. Reported: mean and std over runs. speedup(method) = mean tokens/s of
the method / mean tokens/s of AR, with the same model, the same cache code and the same prompts.
At T = 0 every output is compared with AR's and classified exact / near-tie / mismatch
(pipeline/decode/lossless.py: strict in fp32; in bf16 a divergence at a rounding near-tie is allowed).
Warm-up generations come first.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from tqdm import tqdm

from pipeline.decode.controller import Controller
from pipeline.decode.engine import Engine, GenerationResult
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
        cyc = [c for r in self.generations(idx) for c in r.cycles]
        return sum(c.emitted for c in cyc) / len(cyc) if cyc else None

    def mean_depth(self, idx=None) -> float | None:
        cyc = [c for r in self.generations(idx) for c in r.cycles]
        return sum(c.depth for c in cyc) / len(cyc) if cyc else None

    def controller_share(self, idx=None) -> float:
        """Controller time as a fraction of decode wall time."""
        rs = self.generations(idx)
        wall = sum(r.wall_s for r in rs)
        return sum(c.t_controller for r in rs for c in r.cycles) / wall if wall else 0.0


def run_methods(engine: Engine, prompts: list[list[int]], methods: dict[str, Controller | None],
                max_new_tokens: int, temperature: float = 0.0, runs: int = 3, seed: int = 0,
                warmup: int = 1, progress: bool = True, between=None) -> tuple[dict[str, MethodRuns], list[tuple]]:
    """methods: name -> controller (None = AR). Returns (runs per method, lossless verdicts): at T = 0,
    one (name, run, prompt_index, LosslessVerdict) per non-AR generation (AR must come first in
    `methods`); the classification's extra forwards run between generations, in no clock.
    Methods are interleaved per prompt so slow drifts of the machine hit all of them alike.
    between(run, prompt_index): called after every method has decoded that prompt (validate's
    interleaved profile rounds); its time is in no generation's clock."""
    warm = prompts[0]
    for _ in range(warmup):
        for ctrl in methods.values():
            (engine.generate_ar(warm, 16, temperature, seed) if ctrl is None
             else engine.generate(warm, 16, temperature, seed, controller=ctrl))
    out = {name: MethodRuns(name) for name in methods}
    verdicts = []
    total = runs * len(prompts) * len(methods)
    bar = tqdm(total=total, desc="validate", unit="gen", disable=not progress)
    for r in range(runs):
        for m in out.values():
            m.results.append([])
        for i, ids in enumerate(prompts):
            ar_ids = None
            for name, ctrl in methods.items():
                s = seed + 1000 * r + i
                res = (engine.generate_ar(ids, max_new_tokens, temperature, s) if ctrl is None
                       else engine.generate(ids, max_new_tokens, temperature, s, controller=ctrl))
                out[name].results[r].append(res)
                if ctrl is None:
                    ar_ids = res.output_ids
                elif temperature <= 0 and ar_ids is not None:
                    verdicts.append((name, r, i, classify(engine.model, ids, ar_ids, res.output_ids)))
                bar.update(1)
            if between is not None:
                between(r, i)
    bar.close()
    return out, verdicts


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
                out[n][f"speedup_vs_{b}"] = mean[n] / mean[b]
    return out


