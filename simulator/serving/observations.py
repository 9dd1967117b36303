"""The load-aware observation: what a serving step's shape policy sees (simulator/serving/env.py
trains on it, simulator/serving/choosers/learned.py replays it; docs/serving.md, "Learned load-aware policies").

One vector per batch, built by ONE function (`load_obs`) from padded per-row arrays [n, M] and a mask,
M = max_batch; the replay env passes its slot state ([n envs, M]), the load replay and a batched
engine pass one batch ([1, M], `step_obs`), so the two are the same numbers (a test checks it). The
replay reads the confidences from the logs' rows; the batched engine measures s_r(1) itself (the
top-1 log-prob of the roots' pending draft forward: StepContext.confidence), so on the device
only k <= 1 can be observed (online/adapters/chooser.py).

    index  feature                                   scale            when the engine has it
    0      B / M                                     rows             before drafting (the scheduler)
    1      min(queued / M, QUEUE_CAP)                requests         before drafting (the scheduler)
    2      mean_r context_r / 1000                   tokens           before drafting
    3      EMA of mean_r L_r / ACCEPT_SCALE          accepted drafts  before drafting (earlier verifies)
    4      1 once the EMA has a value, else 0                         before drafting
    5      previous step's D / 8                                      before drafting
    6      log2(previous step's V) / 8                                before drafting
    7 + 2(d-1), 8 + 2(d-1)   for d = 1 .. k:   mean_r s_r(d),  min_r s_r(d)
                             s_r(d) = row r's best-beam cumulative draft log-prob after draft forward d
                             (clean_scores: NaN and < -20 -> -20)   after draft forward d (probe, below)

The EMA (SGLang's adaptive rule keeps the same one, weight 0.2): after a step that drafted,
ema <- (1 - beta) ema + beta mean_r L_r (the first such step sets ema = mean_r L_r); an "off" step
leaves it. The previous shape lets the net read the EMA (a chain of 1 cannot accept more than 1).

The confidences (k = `confidence_depth`, 0 = none) need k draft forwards of the probe's width before
the decision: d = 1 is the top-1 log-prob of the first draft forward, the same at every width; d >= 2
reads the probe's beam (width 1, the chain's, when width-1 logs exist; else the primary width's best
beam). A decision whose shape does not draft those forwards itself pays for them (`probe_forwards`):

    off                       k forwards
    a shape of the probe's W  max(0, k - D)   (its own first D forwards are the probe's)
    any other shape           max(0, k - 1)   (the first forward, from the root, is shared)

each at t_draft(W_probe, c, B). With k = 1 and width-1 probes only "off" pays (one forward).
Aggregates are taken in float64 over the active rows compacted in slot order (holes dropped, so a
slot layout with holes and the same rows packed give the same sums bit for bit), then cast to float32.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from pipeline.errors import DataError
from simulator.observations.paper import CTX_SCALE, SCORE_FLOOR, clean_scores

N_BASE = 7              # features 0..6
QUEUE_CAP = 4.0         # queued / M is clipped here
ACCEPT_SCALE = 8.0      # mean L / 8
EMA_WEIGHT = 0.2        # SGLang's ema_alpha


@dataclass(frozen=True)
class LoadObsSpec:
    """What the observation holds; saved in the checkpoint's manifest (components.shape.obs)."""
    max_batch: int = 16                 # M: rows of a full batch
    confidence_depth: int = 1           # k: best-beam scores at draft depths 1..k (0: none)
    probe_width: int = 1                # W of the beam the confidences read (1: the chain's)
    ema_weight: float = EMA_WEIGHT      # beta of the accept-length EMA

    @property
    def dim(self) -> int:
        return N_BASE + 2 * self.confidence_depth

    def to_json(self) -> dict:
        return {"name": "serving_load", **asdict(self), "dim": self.dim}

    @classmethod
    def from_json(cls, d: dict) -> "LoadObsSpec":
        if d.get("name") != "serving_load":
            raise DataError(f"not a load-aware observation spec: {d.get('name')!r}")
        return cls(int(d["max_batch"]), int(d["confidence_depth"]), int(d["probe_width"]), float(d["ema_weight"]))


def make_spec(logs, max_batch: int, confidence_depth: int = 1) -> LoadObsSpec:
    """The spec for these logs: the probe is the width-1 beam when logged, else the primary width's."""
    if not 0 <= confidence_depth <= logs.max_depth:
        raise DataError(f"confidence depth must be in 0..{logs.max_depth}, got {confidence_depth}")
    if max_batch < 1:
        raise DataError(f"max_batch must be >= 1, got {max_batch}")
    return LoadObsSpec(int(max_batch), int(confidence_depth), 1 if 1 in logs.w else int(logs.width))


def confidences(logs, spec: LoadObsSpec, rows=None) -> np.ndarray:
    """[n, k] s_r(d), d = 1..k, of log rows `rows` (all rows when None), cleaned (module docstring)."""
    if spec.probe_width not in logs.w:
        raise DataError(f"the observation reads width {spec.probe_width}, not in the logs (widths {list(logs.w)})")
    beams = logs.w[spec.probe_width].beam_scores                      # [N, Dmax, W]
    s = beams[:, :spec.confidence_depth, 0] if rows is None else beams[np.asarray(rows), :spec.confidence_depth, 0]
    return clean_scores(s)


def load_obs(spec: LoadObsSpec, mask, queued, context_len, conf, ema, has_ema, prev_depth, prev_verify) -> np.ndarray:
    """The observation of n batches (module docstring) -> [n, dim] float32.

    mask [n, M] bool: active slots (at least one per batch); queued [n]; context_len [n, M];
    conf [n, M, k] (k = spec.confidence_depth); ema, has_ema, prev_depth, prev_verify [n].
    Inactive slots are ignored whatever they hold."""
    mask = np.asarray(mask, bool)
    n, M = mask.shape
    if M != spec.max_batch:
        raise ValueError(f"rows padded to {M}, the spec's max_batch is {spec.max_batch}")
    B = mask.sum(1).astype(np.float64)                                 # [n]
    if (B == 0).any():
        raise ValueError("a batch with no active row has no observation")
    order = np.argsort(~mask, axis=1, kind="stable")                   # active slots first, in slot order
    mask = np.take_along_axis(mask, order, 1)
    out = np.empty((n, spec.dim), np.float32)
    out[:, 0] = B / M
    out[:, 1] = np.minimum(np.asarray(queued, np.float64) / M, QUEUE_CAP)
    ctx = np.where(mask, np.take_along_axis(np.asarray(context_len, np.float64), order, 1), 0.0)
    out[:, 2] = ctx.sum(1) / B / CTX_SCALE
    out[:, 3] = np.asarray(ema, np.float64) / ACCEPT_SCALE
    out[:, 4] = np.asarray(has_ema, np.float64)
    out[:, 5] = np.asarray(prev_depth, np.float64) / 8.0
    out[:, 6] = np.log2(np.maximum(np.asarray(prev_verify, np.float64), 1.0)) / 8.0
    if spec.confidence_depth:
        c = np.take_along_axis(np.asarray(conf, np.float64), order[:, :, None], 1)      # [n, M, k]
        m = mask[:, :, None]
        out[:, N_BASE::2] = np.where(m, c, 0.0).sum(1) / B[:, None]
        out[:, N_BASE + 1::2] = np.where(m, c, 0.0 - SCORE_FLOOR).min(1)
    return out


def step_obs(spec: LoadObsSpec, logs, rows, context_len, queued: int, ema: float, has_ema: bool,
             prev_depth: int, prev_verify: int, conf=None) -> np.ndarray:
    """One batch's observation [1, dim] from its B active rows in slot order (what the load replay's
    StepView and a batched engine hold): padded to M and passed to `load_obs`.

    The confidences [B, k] are the logs' (`confidences(logs, spec, rows)`, the replay) unless `conf`
    gives them (the device: the engine's measured s_r(1), online/adapters/chooser.py; `logs` and
    `rows` are then read for nothing but B); either way cleaned by the same `clean_scores`."""
    rows = np.asarray(rows, np.int64)
    B, M, k = len(rows), spec.max_batch, spec.confidence_depth
    if not 1 <= B <= M:
        raise DataError(f"a batch of {B} rows does not fit max_batch {M}")
    mask = np.zeros((1, M), bool)
    mask[0, :B] = True
    ctx = np.zeros((1, M))
    ctx[0, :B] = context_len
    c = np.zeros((1, M, k), np.float32)
    if k and conf is None:
        c[0, :B] = confidences(logs, spec, rows)
    elif k:
        given = np.asarray(conf, np.float64)
        if given.shape != (B, k):
            raise DataError(f"confidences of shape {given.shape} for {B} rows at depth {k}; want ({B}, {k})")
        c[0, :B] = clean_scores(given)
    return load_obs(spec, mask, [queued], ctx, c, [ema], [has_ema], [prev_depth], [prev_verify])


def ema_update(spec: LoadObsSpec, ema, has_ema, drafted, mean_accepted):
    """(ema, has_ema) after a step: the accept-length EMA moves only where the step drafted (vectorised)."""
    drafted = np.asarray(drafted, bool)
    first = drafted & ~np.asarray(has_ema, bool)
    new = np.where(first, mean_accepted, (1 - spec.ema_weight) * np.asarray(ema, np.float64)
                   + spec.ema_weight * np.asarray(mean_accepted, np.float64))
    return np.where(drafted, new, ema), np.asarray(has_ema, bool) | drafted


def probe_forwards(spec: LoadObsSpec, depth, width) -> np.ndarray:
    """Draft forwards of the probe a decision pays for beyond its shape's own (module docstring)."""
    k = spec.confidence_depth
    depth, width = np.asarray(depth, np.int64), np.asarray(width, np.int64)
    same = np.maximum(0, k - depth)
    other = np.full(depth.shape, max(0, k - 1))
    return np.where(depth == 0, k, np.where(width == spec.probe_width, same, other))


def decision_cost(spec: LoadObsSpec, latency, depth, width, batch, context_len) -> np.ndarray:
    """Seconds a decision adds to its step: the probe's extra forwards at (W_probe, c, B) plus one
    policy call (the latency model's policy op; one observation per batch, batch-1 cost)."""
    extra = probe_forwards(spec, depth, width)
    t_probe = latency.t_draft(spec.probe_width, np.asarray(context_len, np.float64), batch=np.asarray(batch))
    return extra * t_probe + float(latency.t_policy())
