"""Request arrival times for the serving replay (simulator/serving/load.py): [R] seconds, non-decreasing.

    poisson(rate, n, seed)    exponential gaps of mean 1 / rate:  t_i = sum_{j <= i} g_j,  g_j ~ Exp(rate)
    sweep(rates, n, seed)     a load sweep: n Poisson arrivals at each rate in turn, continuing in time
                              (n one count, or one per rate: segment_counts, e.g. equal seconds per rate)
    read_trace(path)          a file of arrival times: one number per line (blank lines and # comments
                              skipped) or one JSON list; read exactly; a bad file is a one-line DataError
    write_trace(path, ...)    the same file from times: a # header, then one time per line, written
                              with Python's shortest round-trip repr, so read_trace gives back the
                              same float64 values (`draftgym serve-eval --write-trace`)
    rates_for_batches(...)    the rates that would hold B rows busy under AR decoding (Little's law):

        B = lambda * T * t_AR(B) / (1 - lambda * t_pf)   =>   lambda_B = B / (T * t_AR(c, B) + B * t_pf)

    with T the mean tokens per request, t_AR(c, B) the AR step at B rows and t_pf the mean prefill
    (every row waits while a joining request is prefilled, so a share lambda * t_pf of the clock
    decodes nothing; 0 without prefill rows in the profile). Speculation serves the same rate with
    fewer rows busy. A sweep over lambda_1, lambda_2, lambda_4, ... moves the batch size from about 1
    to the largest target. `rates_for_logs` reads T, c and t_pf from a split's logs.

Every request replays one logged sequence (the split's sequences in order, cycled: replay.request_sequences).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from pipeline.errors import DataError


def poisson(rate: float, n: int, seed: int = 0, start: float = 0.0) -> np.ndarray:
    if not rate > 0 or not math.isfinite(rate):
        raise DataError(f"arrival rate must be a positive number of requests/s, got {rate}")
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, int(n))
    return start + np.cumsum(gaps)


def segment_counts(rates, n_per_rate: int | None = None, seconds: float | None = None) -> list[int]:
    """Requests in each rate's segment of a sweep: n_per_rate each (equal requests: the low rates
    take the longest), or, given `seconds`, max(1, round(rate * seconds)) (equal time at each load)."""
    if seconds is None:
        return [int(n_per_rate)] * len(rates)
    if not seconds > 0 or not math.isfinite(seconds):
        raise DataError(f"segment seconds must be a positive number, got {seconds}")
    return [max(1, int(round(float(r) * seconds))) for r in rates]


def sweep(rates, n_per_rate, seed: int = 0) -> np.ndarray:
    """n_per_rate Poisson arrivals at each rate in turn (an int, or one count per rate:
    segment_counts), seed + k for the k-th segment."""
    counts = [int(n_per_rate)] * len(rates) if np.isscalar(n_per_rate) else [int(n) for n in n_per_rate]
    if len(counts) != len(rates):
        raise DataError(f"{len(counts)} segment counts for {len(rates)} rates")
    out, t = [], 0.0
    for k, (r, n) in enumerate(zip(rates, counts)):
        seg = poisson(float(r), n, seed + k, start=t)
        out.append(seg)
        t = float(seg[-1]) if len(seg) else t
    return np.concatenate(out) if out else np.zeros(0)


def read_trace(path) -> np.ndarray:
    """Arrival times from a file (module docstring)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"arrival trace {path} not found")
    text = path.read_text(errors="replace").strip()
    try:
        if text.startswith("["):
            vals = json.loads(text)
            if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals):
                raise ValueError("a JSON trace is one list of numbers")
        else:
            vals = [float(line.split("#")[0]) for line in text.splitlines() if line.split("#")[0].strip()]
    except (ValueError, json.JSONDecodeError) as e:
        raise DataError(f"arrival trace {path}: {str(e).splitlines()[0]} (one time in seconds per line, or a JSON list)") from None
    t = np.asarray(vals, np.float64)
    if t.size == 0:
        raise DataError(f"arrival trace {path} holds no arrival time")
    if not np.all(np.isfinite(t)) or (t < 0).any():
        raise DataError(f"arrival trace {path}: times must be finite and >= 0")
    if (np.diff(t) < 0).any():
        i = int(np.flatnonzero(np.diff(t) < 0)[0])
        raise DataError(f"arrival trace {path}: times must not decrease (entry {i + 2} is {t[i + 1]:g} after {t[i]:g})")
    return t


def write_trace(path, times, header=(), segments=None) -> Path:
    """Arrival times [R] to a trace file (module docstring). header: comment lines written first;
    segments: (label, count) pairs, a `# label: requests i-j` comment before each run of `count`
    times (a sweep's rates), counts summing to R."""
    t = np.asarray(times, np.float64)
    if t.ndim != 1 or t.size == 0 or not np.all(np.isfinite(t)) or (t < 0).any() or (np.diff(t) < 0).any():
        raise DataError("a trace needs at least one finite arrival time >= 0, non-decreasing")
    segments = list(segments) if segments is not None else [(None, len(t))]
    if sum(n for _, n in segments) != len(t):
        raise DataError(f"trace segments count {sum(n for _, n in segments)} requests, the times {len(t)}")
    lines = [f"# {h}" for h in header]
    i = 0
    for name, n in segments:
        if name is not None:
            lines.append(f"# {name}: requests {i + 1}-{i + n}")
        lines += [repr(float(x)) for x in t[i:i + n]]
        i += n
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def rates_for_batches(batches, mean_tokens: float, latency, context_len: float,
                      mean_prefill: float = 0.0) -> np.ndarray:
    """[n] requests/s that keep about B rows busy under AR decoding (module docstring)."""
    b = np.asarray(batches, np.float64)
    t_ar = np.array([float(latency.t_ar(context_len, batch=int(x))) for x in b])
    return b / (float(mean_tokens) * t_ar + b * float(mean_prefill))


def rates_for_logs(batches, logs, latency) -> np.ndarray:
    """rates_for_batches with a split's mean tokens per request, mean context and mean prefill (of
    its prompts, as the load replay prefills them: load.serve)."""
    return rates_for_batches(batches, float(np.mean(logs.new_tokens - 1)), latency, float(np.mean(logs.context_len)),
                             float(np.mean(latency.t_prefill(logs.prompt_len))))
