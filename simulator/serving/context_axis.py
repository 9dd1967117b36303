"""Context as a schedule axis: does choosing the shape by the step's context, not only by B, pay?

A schedule reads B. Verify cost grows with the context c (attention over c keys per tree token), and
acceptance may too, so the best shape at B could differ between short and long contexts. `tune
--context-bins K` answers it on the tuning split:

1. bins: K context bins, edges at the split's row-context quantiles (equal positions per bin), and
   the step context c of LatencyModel.step_context (the longest row's for DraftGym's engine, the
   mean for a paged one).
2. per (B, bin, shape): the closed batch's tokens and time summed over the steps whose c falls in
   the bin (replay.closed_batch with context_edges), so tokens/s(s, B, bin); the best shape per bin.
3. the answer, measured exactly: for each B, the closed batch of B rows replayed (load.serve, every
   request at t = 0, the drain included) under the best single shape at B and under the
   context-split choice (`ContextChooser`: the bin of each step's c picks the shape), same requests;
   gain = tokens/s of the split / tokens/s of the single shape.

Step 2's per-bin figures come from runs that hold one shape throughout, so a split's rows visit the
positions the single shapes visited; step 3 replays the split itself, so its gain is exact. The split
pays when the gain reaches --context-min-gain (default 1.01). No engine format carries a context
axis (vLLM's num_speculative_tokens_per_batch_size and SGLang's tiers key on the batch size only), so
the answer is reported and not exported.
"""
from __future__ import annotations

import numpy as np

from pipeline.decode import step_shape
from pipeline.errors import DataError
from simulator.serving import metrics
from simulator.serving.choosers.base import Chooser, StaticChooser
from simulator.serving.load import serve
from simulator.serving.replay import ShapeTable, closed_batch


def context_edges(logs, n_bins: int) -> np.ndarray:
    """[<= n_bins - 1] increasing edges at the rows' context quantiles (duplicates merged)."""
    if n_bins < 2:
        raise DataError(f"--context-bins needs at least 2 bins, got {n_bins}")
    q = np.quantile(logs.context_len.astype(np.float64), np.arange(1, n_bins) / n_bins)
    return np.unique(np.ceil(q))


class ContextChooser(Chooser):
    """The shape of the bin holding the step's context, for the B it was tuned at (or the largest
    tuned B below; the smallest when B is below every one)."""

    def __init__(self, by_batch: dict[int, list], edges, name: str = "schedule (per B and context)"):
        self.by_batch = {int(b): [step_shape.canonical(s) for s in v] for b, v in by_batch.items()}
        self.keys, self.edges, self.name = sorted(self.by_batch), np.asarray(edges, np.float64), name

    def shapes(self):
        return list(dict.fromkeys(s for v in self.by_batch.values() for s in v))

    def choose(self, view):
        b = max([k for k in self.keys if k <= view.batch] or self.keys[:1])
        k = int(np.searchsorted(self.edges, self.latency.step_context(view.context_len), side="right"))
        return self.table.index(self.by_batch[b][k])


def context_axis(logs, latency, batch_sizes, shapes, n_bins: int = 2, requests_per_slot: int = 4,
                 min_gain: float = 1.01) -> dict:
    """The three steps of the module docstring -> {"edges", "per_batch": [{batch, single, by_bin,
    bin_tokens_per_s, gain, ...}], "pays", "best_gain"}."""
    shapes = [step_shape.canonical(s) for s in shapes]
    edges = context_edges(logs, n_bins)
    table = ShapeTable(logs, shapes)
    out = []
    for B in sorted({int(b) for b in batch_sizes}):
        R = max(logs.n_sequences, requests_per_slot * B)
        run = closed_batch(logs, latency, table, B, n_requests=R, context_edges=edges)
        single = shapes[int(np.argmax(run["tokens_per_s"]))]
        with np.errstate(invalid="ignore", divide="ignore"):
            tps = run["tokens_by_context"] / run["time_by_context"]                    # [A, K]
        seen = run["time_by_context"].sum(0) > 0
        by_bin = [shapes[int(np.nanargmax(tps[:, k]))] if seen[k] else single for k in range(len(edges) + 1)]
        arrivals = np.zeros(R)
        flat = metrics.summarize(serve(logs, latency, table, StaticChooser(single), arrivals, B, prefill=False))
        split = metrics.summarize(serve(logs, latency, table, ContextChooser({B: by_bin}, edges), arrivals, B, prefill=False))
        out.append({"batch": B, "single": step_shape.label(single), "by_bin": [step_shape.label(s) for s in by_bin],
                    "bin_share_of_time": (run["time_by_context"][shapes.index(single)]
                                          / max(run["time"][shapes.index(single)], 1e-12)).round(4).tolist(),
                    "single_tokens_per_s": flat["tokens_per_s"], "split_tokens_per_s": split["tokens_per_s"],
                    "gain": split["tokens_per_s"] / flat["tokens_per_s"]})
    best = max(r["gain"] for r in out)
    return {"edges": edges.tolist(), "per_batch": out, "best_gain": best, "pays": best >= min_gain,
            "min_gain": min_gain}


def context_lines(ans: dict) -> list[str]:
    """The answer as printed lines."""
    e = ans["edges"]
    bins = [f"c < {e[0]:g}"] + [f"{a:g} <= c < {b:g}" for a, b in zip(e, e[1:])] + [f"c >= {e[-1]:g}"]
    lines = [f"context axis ({len(bins)} bins: {', '.join(bins)}):"]
    for r in ans["per_batch"]:
        same = len(set(r["by_bin"])) == 1
        lines.append(f"  B {r['batch']:>3}: single {r['single']:<14} by context "
                     + ("(same shape in every bin)" if same else " / ".join(r["by_bin"]))
                     + f"  gain {r['gain']:.4f}x ({r['split_tokens_per_s']:.1f} against {r['single_tokens_per_s']:.1f} tokens/s)")
    verdict = "pays" if ans["pays"] else "does not pay"
    lines.append(f"  splitting the schedule by context {verdict} here: best gain {ans['best_gain']:.4f}x "
                 f"(threshold {ans['min_gain']:.2f}x); no engine format carries a context axis, so nothing is exported")
    return lines
