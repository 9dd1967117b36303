"""Policies: the vectorised mirror of `pipeline.controller.Controller`, checkpoints and a loader.

A `Policy` has the engine's four hooks, batched over many independent generations ("envs"):

    reset(n_envs, seed)                 start of every generation batch
    plan(PlanBatch) -> Shape            cycle start: D_max, W, V and the policy calls it made
    continue_drafting(StepBatch) -> bool[n]   after draft forward `depth` (< D_max); False = STOP
    verify_size(PoolBatch, V) -> V[n]   once before verification (size policies)
    observe(env, record)                after the cycle (numpy arrays keyed like CycleRecord)

Batch-1 fast paths (optional): the online controller (PolicyController, n = 1) calls these instead
of the batched hooks when a policy defines them. They must make the same decisions from the same
observations (observations.*_one / *_parts are bit-equal to the batched builders; tests check both):

    plan_one(ctx: CycleContext) -> (D_max, W, V)          (only for plans that make no policy call)
    continue_one(step: DraftStep) -> bool
    verify_size_one(pool_scores [W + (D-1) W^2], depth, context_len, verify) -> V

Class attributes tell the simulator which hooks to call and what a call costs:
    uses_depth_hook / uses_size_hook    bool
    width                               the W its hooks' observations assume (hook policies)
    call_cost                           "model" (latency.t_policy per call) or seconds (heuristics: 0.0)

Inputs hold exactly what the engine exposes (DraftStep fields, DraftPool scores, CycleContext,
CycleRecord), so an online adapter feeds the same policy with n = 1; observation vectors are
always built by `simulator.observations`.

Checkpoints: a directory with manifest.json + one torch state_dict file per component:

    {"format": "draftgym-policy", "version": 1, "name": ..., "method": "ltd" | "radar" | "resps",
     "components": {"depth"|"size"|"radar"|"shape": {
         "file": "depth.pt",
         "net": {"type": "mlp", "in": 102, "hidden": [1024], "out": 2, "obs_norm": true}   |
                {"type": "radar_lstm", "in": 10, "hidden": 128, "mlp_hidden": 128, "out": 2},
         "obs": {"name": "ltd_depth" | "ltd_size" | "radar" | "resps", "width": 10, "max_depth": 12, "dim": 102},
         "action": {"type": "stop_continue", "max_depth": 12} | {"type": "verify_size", "values": [20, ..]} |
                   {"type": "shape", "shapes": [[V, D, W], ..], "hold": 30}}},
     "shape": {"width": 10, "max_depth": 12, "verify_size": 60},    # defaults the hooks start from
     "training": {...}, "created": "..."}

`load_policy(spec)` accepts such a directory or a built-in name:
    static:D,W,V   ddd[:threshold]   entropy[:theta]   goodput   oracle[:static|depth]   random[:seed]
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.errors import DraftGymError
from simulator import observations as obs

FORMAT = "draftgym-policy"
FORMAT_VERSION = 1
STOP, CONTINUE = 0, 1


# ------------------------------------------------------------------ hook inputs

@dataclass
class PlanBatch:
    env: np.ndarray               # [n] env ids
    seq: np.ndarray               # [n] sequence index (replay only: the oracle's lookup)
    position: np.ndarray          # [n] root position p (replay only: the oracle's lookup)
    cycle: np.ndarray             # [n] cycle index within the generation
    context_len: np.ndarray       # [n]
    has_last: np.ndarray          # [n] bool: a previous cycle exists
    last_depth: np.ndarray        # [n] previous cycle's D, W, V (effective), L, emitted (0 if none)
    last_width: np.ndarray
    last_verify: np.ndarray
    last_accepted: np.ndarray
    last_emitted: np.ndarray
    last_root_scores: np.ndarray  # [n, 8] previous cycle's depth-1 scores (NaN-padded)


@dataclass
class StepBatch:
    """Batched `pipeline.tree.DraftStep`."""
    env: np.ndarray
    depth: int                    # draft forwards done (same for the whole batch)
    width: int
    beam_scores: np.ndarray       # [n, W]
    candidate_scores: np.ndarray  # [n, W*W] (W valid + NaN after forward 1)
    entropy: np.ndarray           # [n, W] (slot 0 valid after forward 1)
    context_len: np.ndarray       # [n]
    sorted_candidates: np.ndarray | None = None   # [n, W*W] = observations.sort_desc(candidate_scores, W*W)


@dataclass
class PoolBatch:
    """Batched `DraftPool`, as per-level scores sorted within each level (observations.sort_levels)."""
    env: np.ndarray
    depth: np.ndarray             # [n] D drafted
    width: int
    level_scores: np.ndarray      # [n, Dmax, W*W] sorted per level, levels >= D are to be ignored
    context_len: np.ndarray


@dataclass
class Shape:
    depth: np.ndarray             # D_max (the depth when no depth hook stops earlier)
    width: np.ndarray
    verify: np.ndarray            # V (before the size hook, if any)
    calls: np.ndarray             # policy inferences made in plan()


class Policy:
    name = "policy"
    uses_depth_hook = False
    uses_size_hook = False
    step_fields = ("beam_scores", "candidate_scores", "entropy")   # StepBatch fields continue_drafting reads
    reads_root_scores = True         # plan() reads PlanBatch.last_root_scores (Re-SpS)
    call_cost: str | float = 0.0
    width: int | None = None

    def reset(self, n_envs: int, seed: int = 0) -> None:
        pass

    def plan(self, b: PlanBatch) -> Shape:
        raise NotImplementedError

    def continue_drafting(self, s: StepBatch) -> np.ndarray:
        return np.ones(len(s.env), bool)

    def verify_size(self, pool: PoolBatch, verify: np.ndarray) -> np.ndarray:
        return verify

    def observe(self, env: np.ndarray, record: dict) -> None:
        pass

    def describe(self) -> dict:
        return {"name": self.name}


def const_shape(n: int, depth: int, width: int, verify: int, calls: int = 0) -> Shape:
    return Shape(np.full(n, depth, np.int64), np.full(n, width, np.int64), np.full(n, verify, np.int64),
                 np.full(n, calls, np.int64))


# ------------------------------------------------------------------ networks

def build_net(spec: dict):
    """torch module from a manifest `net` spec."""
    import torch.nn as nn

    if spec["type"] == "mlp":
        layers, d = ([ObsNorm(spec["in"])] if spec.get("obs_norm") else []), spec["in"]
        for h in spec["hidden"]:
            layers += [nn.Linear(d, h), nn.ReLU()]
            d = h
        layers.append(nn.Linear(d, spec["out"]))
        return nn.Sequential(*layers)
    if spec["type"] == "radar_lstm":
        return RadarNet(spec["in"], spec.get("hidden", 128), spec.get("mlp_hidden", 128), spec.get("out", 2))
    raise DraftGymError(f"unknown net type {spec['type']!r}")


def ObsNorm(n: int):
    """Fixed input standardisation (x - mean) / std, with buffers saved in the state_dict; the
    trainer sets them from observations of the training env before training (`set_obs_norm`)."""
    import torch
    import torch.nn as nn

    class _ObsNorm(nn.Module):
        def __init__(self, n):
            super().__init__()
            self.register_buffer("mean", torch.zeros(n))
            self.register_buffer("std", torch.ones(n))

        def forward(self, x):
            return (x - self.mean) / self.std

    return _ObsNorm(n)


def set_obs_norm(net, observations: np.ndarray, min_std: float = 1e-2) -> None:
    """Set an MLP's ObsNorm from a sample of observations [n, dim] (constant features: std 1)."""
    import torch

    layer = net[0]
    m = observations.mean(0)
    sd = observations.std(0)
    sd = np.where(sd < min_std, 1.0, sd)
    layer.mean.copy_(torch.from_numpy(m.astype(np.float32)))
    layer.std.copy_(torch.from_numpy(sd.astype(np.float32)))


class _NumpyCopy:
    """A numpy copy of a torch net that knows when it is stale: built from another net, or the net's
    weights changed in place since (the sum of the tensors' version counters moves on every
    optimiser step or load). The tensors are listed once: walking the module tree costs ~0.1 ms."""

    def _track(self, net) -> None:
        self.net, self.tensors = net, list(net.parameters()) + list(net.buffers())
        self.version = sum(t._version for t in self.tensors)

    def stale(self, net) -> bool:
        return net is not self.net or sum(t._version for t in self.tensors) != self.version

    @classmethod
    def fresh(cls, cached, net, **kw):
        """`cached` if it is still the net's function, else a new copy."""
        return cached if cached is not None and not cached.stale(net) else cls(net, **kw)


class NumpyMLP(_NumpyCopy):
    """Batch-1 forward of an `mlp` net (build_net) in numpy: the online controller's path.

    Same weights and the same function as the torch module, up to float rounding (the tests check
    logits to 1e-5 and the argmax). Why: inside decoding every call sits between two cache-flushing
    verify forwards, and torch's per-op dispatch (~10 us per op, cold) cost LTD 1.5 % of decode
    time (BENCHMARKS.md E2); numpy's is ~1 us.

    `live`: when the input's columns [live, in - tail) are known to hold one constant vector `pad`
    (LTD's size observation: levels deeper than the drafted depth are SCORE_FLOOR), the first layer
    is  h1 = b1 + x[:live] W1[:live] + x[-tail:] W1[-tail:] + c(live),
            c(live) = norm(pad)[live:-tail] W1[live:-tail]   (cached per live),
    so a depth-1 tree reads 12 of LTD's 1112 weight rows instead of all of them. Rows are columns
    of the torch weight: W1 here is weight.T, [in, out].
    """

    def __init__(self, net, pad: np.ndarray | None = None, tail: int = 0):
        import torch.nn as nn

        mods = list(net)
        self.mean = self.std = None
        if not isinstance(mods[0], nn.Linear):          # ObsNorm first
            self.mean = mods[0].mean.detach().numpy().astype(np.float32)
            self.std = mods[0].std.detach().numpy().astype(np.float32)
            mods = mods[1:]
        self.layers = [(np.ascontiguousarray(m.weight.detach().numpy().T), m.bias.detach().numpy().copy())
                       for m in mods if isinstance(m, nn.Linear)]     # [in, out], [out]
        self.pad, self.tail, self._const = pad, tail, {}
        self._track(net)

    def _norm(self, x):
        return x if self.mean is None else (x - self.mean) / self.std

    def __call__(self, x: np.ndarray, live: int | None = None) -> np.ndarray:
        """x: [in] -> logits [out]."""
        W1, b1 = self.layers[0]
        n_in = W1.shape[0]
        if live is None or self.pad is None or live >= n_in - self.tail:
            return self._hidden(self._norm(np.asarray(x, np.float32)) @ W1 + b1)
        xn = self._norm(np.asarray(x, np.float32))
        return self._first_live(xn[:live], xn[n_in - self.tail:] if self.tail else None)

    def call_parts(self, x_live: np.ndarray, x_tail: np.ndarray | None) -> np.ndarray:
        """= self(x, live=len(x_live)) for x = [x_live, pad columns, x_tail], without building x:
        x_live: [live], x_tail: [tail] (or None when tail = 0). Same float ops, same result."""
        n_in, live = self.layers[0][0].shape[0], len(x_live)
        if live >= n_in - self.tail:         # nothing padded: the whole input is given
            return self(np.concatenate([x_live] + ([x_tail] if self.tail else [])))
        if self.pad is None:
            raise ValueError("call_parts needs the padded columns' value (NumpyMLP(pad=...))")
        norm = (lambda v, a, b: v) if self.mean is None else (lambda v, a, b: (v - self.mean[a:b]) / self.std[a:b])
        xn_tail = norm(np.asarray(x_tail, np.float32), n_in - self.tail, n_in) if self.tail else None
        return self._first_live(norm(np.asarray(x_live, np.float32), 0, live), xn_tail)

    def _first_live(self, xn_live, xn_tail):
        """First layer from the normalised live prefix and tail, the padded columns' part cached."""
        W1, b1 = self.layers[0]
        n_in, live = W1.shape[0], len(xn_live)
        if live not in self._const:     # the padded columns' contribution, once per live prefix
            padn = self._norm(self.pad.astype(np.float32))[live: n_in - self.tail]
            self._const[live] = (padn @ W1[live: n_in - self.tail] + b1).astype(np.float32)
        h = self._const[live] + xn_live @ W1[:live]
        if self.tail:
            h = h + xn_tail @ W1[n_in - self.tail:]
        return self._hidden(h)

    def _hidden(self, h):
        for W, b in self.layers[1:]:
            h = np.maximum(h, 0.0) @ W + b
        return h


class NumpyRadar(_NumpyCopy):
    """Batch-1 step of RADAR's net (LSTMCell + MLP) in numpy: the online controller's path, for the
    same reason as NumpyMLP (torch's per-op dispatch between two verify forwards). PyTorch's LSTMCell:
        gates = x W_ih^T + b_ih + h W_hh^T + b_hh = [i | f | g | o]      # [4 hidden]
        c' = sigmoid(f) c + sigmoid(i) tanh(g),   h' = sigmoid(o) tanh(c')
    then logits = MLP([h', x])."""

    def __init__(self, net):
        cell = net.cell
        # one matmul for both inputs: [x, h] @ [W_ih | W_hh]^T
        self.W = np.ascontiguousarray(np.concatenate(
            [cell.weight_ih.detach().numpy().T, cell.weight_hh.detach().numpy().T]).astype(np.float32))  # [k + hidden, 4 hidden]
        self.b = (cell.bias_ih + cell.bias_hh).detach().numpy().astype(np.float32)     # [4 hidden]
        self.mlp = NumpyMLP(net.head)
        self._track(net)

    def __call__(self, x: np.ndarray, h: np.ndarray, c: np.ndarray):
        """x: [k], h, c: [hidden] -> (logits [2], h', c')."""
        x = np.asarray(x, np.float32)
        gates = np.concatenate([x, h]) @ self.W + self.b
        i, f, g, o = np.split(gates, 4)
        sig = lambda z: 0.5 * (np.tanh(0.5 * z) + 1.0)               # = 1 / (1 + e^-z), no overflow
        c2 = sig(f) * c + sig(i) * np.tanh(g)
        h2 = sig(o) * np.tanh(c2)
        return self.mlp(np.concatenate([h2, x])), h2.astype(np.float32), c2.astype(np.float32)


def _radar_net_cls():
    import torch
    import torch.nn as nn

    class _RadarNet(nn.Module):
        """RADAR: LSTM(k -> 128) over the per-call confidences, then MLP([h_t, x_t] (138) -> 128 -> 2)."""

        def __init__(self, n_in: int = 10, hidden: int = 128, mlp_hidden: int = 128, n_out: int = 2):
            super().__init__()
            self.hidden = hidden
            self.cell = nn.LSTMCell(n_in, hidden)
            self.head = nn.Sequential(nn.Linear(hidden + n_in, mlp_hidden), nn.ReLU(), nn.Linear(mlp_hidden, n_out))

        def init_state(self, n: int):
            z = torch.zeros(n, self.hidden)
            return z, z.clone()

        def forward(self, x, state):
            h, c = self.cell(x, state)
            return self.head(torch.cat([h, x], -1)), (h, c)

    return _RadarNet


def RadarNet(*a, **kw):
    return _radar_net_cls()(*a, **kw)


def _torch_logits(net, x: np.ndarray) -> np.ndarray:
    import torch

    with torch.no_grad():
        return net(torch.from_numpy(np.ascontiguousarray(x, np.float32))).numpy()


def _choose(logits: np.ndarray, sample: bool, rng: np.random.Generator | None) -> np.ndarray:
    if not sample:
        return logits.argmax(-1)
    z = logits - logits.max(-1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(-1, keepdims=True)
    u = rng.random(p.shape[:-1] + (1,))
    return (p.cumsum(-1) < u).sum(-1).clip(0, p.shape[-1] - 1)


# ------------------------------------------------------------------ learned policies

class LTDPolicy(Policy):
    """LTD: an MLP depth policy (STOP/CONTINUE after each forward) and/or an MLP size policy (V)."""

    call_cost = "model"
    step_fields = ("candidate_scores",)

    def __init__(self, depth_net=None, size_net=None, width: int = 10, max_depth: int = 12, verify_size: int = 60,
                 size_values=obs.SIZE_ACTIONS, name: str = "ltd", sample: bool = False, fixed_depth: int = 8):
        self.depth_net, self.size_net = depth_net, size_net
        self.width, self.max_depth, self.verify = width, max_depth, verify_size
        self.size_values = np.asarray(size_values, np.int64)
        self.name, self.sample, self.fixed_depth = name, sample, fixed_depth
        self.uses_depth_hook = depth_net is not None
        self.uses_size_hook = size_net is not None
        self.rng = np.random.default_rng(0)
        self._np_depth = self._np_size = None      # NumpyMLP copies, built on the first batch-1 call

    def reset(self, n_envs, seed=0):
        self.rng = np.random.default_rng(seed)

    def plan(self, b):
        D = self.max_depth if self.uses_depth_hook else self.fixed_depth
        return const_shape(len(b.env), D, self.width, self.verify)

    def continue_drafting(self, s):
        c = s.sorted_candidates
        o = obs.ltd_depth_obs(c if c is not None else s.candidate_scores, s.depth, s.context_len, self.width,
                              presorted=c is not None)
        if len(o) == 1:                  # batch 1 (the online controller): numpy forward, same function
            self._np_depth = NumpyMLP.fresh(self._np_depth, self.depth_net)
            return _choose(self._np_depth(o[0])[None], self.sample, self.rng) == CONTINUE
        return _choose(_torch_logits(self.depth_net, o), self.sample, self.rng) == CONTINUE

    # batch-1 fast paths (see the module docstring): same observations, nets and decisions as the
    # batched hooks, with a few numpy calls instead of ~40 per cycle, which is what LTD's controller
    # time was made of (BENCHMARKS.md G1).
    reads_root_scores = False

    def plan_one(self, ctx) -> tuple[int, int, int]:
        return (self.max_depth if self.uses_depth_hook else self.fixed_depth), self.width, self.verify

    def continue_one(self, step) -> bool:
        o = obs.ltd_depth_obs_one(obs.to_numpy(step.candidate_scores), step.depth, step.context_len,
                                  self.width)                                               # [W*W + 2]
        self._np_depth = NumpyMLP.fresh(self._np_depth, self.depth_net)
        return bool(_choose(self._np_depth(o)[None], self.sample, self.rng)[0] == CONTINUE)

    def verify_size_one(self, pool_scores: np.ndarray, depth: int, context_len: int, verify: int) -> int:
        """verify_size for one generation: pool_scores [W + (D-1) W^2], one DraftPool row."""
        live, tail = obs.ltd_size_obs_parts(pool_scores, self.width, depth, context_len, self.max_depth)
        logits = self._size_mlp().call_parts(live, tail)
        return int(self.size_values[_choose(logits[None], self.sample, self.rng)[0]])

    def _size_mlp(self) -> NumpyMLP:
        """The size net's numpy copy; levels deeper than the drafted depth hold SCORE_FLOOR and the
        last two columns are [depth, context] (the `live` / `call_parts` layout)."""
        if self._np_size is None or self._np_size.stale(self.size_net):
            pad = np.full(obs.ltd_size_obs_dim(self.width, self.max_depth), obs.SCORE_FLOOR, np.float32)
            self._np_size = NumpyMLP(self.size_net, pad=pad, tail=2)
        return self._np_size

    def verify_size(self, pool, verify):
        o = obs.ltd_size_obs(pool.level_scores, pool.depth, pool.context_len, self.width, self.max_depth, presorted=True)
        if len(o) == 1:                  # batch 1: numpy, reading only the drafted levels' weight rows
            D = min(int(np.asarray(pool.depth).ravel()[0]), self.max_depth)
            logits = self._size_mlp()(o[0], live=self.width + (D - 1) * self.width * self.width)
            return self.size_values[_choose(logits[None], self.sample, self.rng)]
        return self.size_values[_choose(_torch_logits(self.size_net, o), self.sample, self.rng)]


class RadarPolicy(Policy):
    """RADAR: an LSTM reads the per-call beam confidences; STOP/CONTINUE, at most `max_calls` forwards."""

    call_cost = "model"
    uses_depth_hook = True
    step_fields = ("beam_scores",)
    reads_root_scores = False

    def __init__(self, net, width: int = 10, verify_size: int = 60, max_calls: int = obs.RADAR_MAX_CALLS,
                 name: str = "radar", sample: bool = False):
        self.net, self.width, self.verify, self.max_calls = net, width, verify_size, max_calls
        self.name, self.sample = name, sample
        self.rng = np.random.default_rng(0)
        self._np = None                            # NumpyRadar copy, built on the first batch-1 call

    def reset(self, n_envs, seed=0):
        self.h = np.zeros((n_envs, self.net.hidden), np.float32)     # [n_envs, hidden] LSTM state
        self.c = np.zeros((n_envs, self.net.hidden), np.float32)
        self.rng = np.random.default_rng(seed)

    def plan(self, b):
        self.h[b.env] = 0.0
        self.c[b.env] = 0.0
        return const_shape(len(b.env), self.max_calls, self.width, self.verify)

    # batch-1 fast paths (see the module docstring)
    def plan_one(self, ctx) -> tuple[int, int, int]:
        self.h[0] = 0.0
        self.c[0] = 0.0
        return self.max_calls, self.width, self.verify

    def continue_one(self, step) -> bool:
        x = obs.radar_obs_one(obs.to_numpy(step.beam_scores), self.width)    # [W]
        self._np = NumpyRadar.fresh(self._np, self.net)
        logits, self.h[0], self.c[0] = self._np(x, self.h[0], self.c[0])
        return bool(_choose(logits[None], self.sample, self.rng)[0] == CONTINUE)

    def continue_drafting(self, s):
        import torch

        x = obs.radar_obs(s.beam_scores, self.width)                  # [n, k]
        idx = np.asarray(s.env)
        if len(x) == 1:                  # batch 1 (the online controller): numpy forward, same function
            self._np = NumpyRadar.fresh(self._np, self.net)
            logits, h, c = self._np(x[0], self.h[idx[0]], self.c[idx[0]])
            self.h[idx[0]], self.c[idx[0]] = h, c
            return _choose(logits[None], self.sample, self.rng) == CONTINUE
        with torch.no_grad():
            logits, (h, c) = self.net(torch.from_numpy(x), (torch.from_numpy(self.h[idx]), torch.from_numpy(self.c[idx])))
        self.h[idx], self.c[idx] = h.numpy(), c.numpy()
        return _choose(logits.numpy(), self.sample, self.rng) == CONTINUE


class ShapePolicy(Policy):
    """Re-SpS: an MLP picks (V, D, W) from a fixed list, held for `hold` cycles (one call per hold)."""

    call_cost = "model"

    def __init__(self, net, shapes, hold: int = 30, max_depth: int = 12, name: str = "resps", sample: bool = False):
        self.net, self.shapes = net, np.asarray(shapes, np.int64)        # [A, 3] (V, D, W)
        self.hold, self.max_depth, self.name, self.sample = hold, max_depth, name, sample
        self.rng = np.random.default_rng(0)

    def reset(self, n_envs, seed=0):
        self.current = np.zeros(n_envs, np.int64)
        self.age = np.zeros(n_envs, np.int64)            # cycles since the last call
        self.rng = np.random.default_rng(seed)

    def plan(self, b):
        n = len(b.env)
        call = (b.cycle == 0) | (self.age[b.env] >= self.hold)
        if call.any():
            i = np.flatnonzero(call)
            o = obs.resps_obs(b.last_root_scores[i], b.last_accepted[i], b.last_depth[i], b.last_verify[i],
                              b.last_width[i], b.last_emitted[i], b.context_len[i], b.has_last[i], self.max_depth)
            self.current[b.env[i]] = _choose(_torch_logits(self.net, o), self.sample, self.rng)
            self.age[b.env[i]] = 0
        self.age[b.env] += 1
        a = self.shapes[self.current[b.env]]
        return Shape(a[:, 1].copy(), a[:, 2].copy(), a[:, 0].copy(), call.astype(np.int64))


# ------------------------------------------------------------------ checkpoints

def save_policy(out: str | Path, name: str, method: str, components: dict, shape: dict,
                training: dict | None = None) -> Path:
    """components: {cname: {"module": torch module, "net": spec, "obs": spec, "action": spec}}."""
    import torch

    from pipeline.schema import write_json_atomic

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    man = {"format": FORMAT, "version": FORMAT_VERSION, "name": name, "method": method, "components": {},
           "shape": shape, "training": training or {}, "created": time.strftime("%Y-%m-%dT%H:%M:%S")}
    for cname, c in components.items():
        f = f"{cname}.pt"
        torch.save(c["module"].state_dict(), out / f)
        man["components"][cname] = {"file": f, "net": c["net"], "obs": c["obs"], "action": c["action"]}
    write_json_atomic(man, out / "manifest.json")
    return out


def read_manifest(path: str | Path) -> dict:
    path = Path(path)
    f = path / "manifest.json" if path.is_dir() else path
    if not f.is_file():
        raise DraftGymError(f"no policy manifest at {f}")
    try:
        man = json.loads(f.read_text())
    except json.JSONDecodeError as e:
        raise DraftGymError(f"{f}: not valid JSON ({e})") from None
    if man.get("format") != FORMAT or man.get("version") != FORMAT_VERSION:
        raise DraftGymError(f"{f}: not a {FORMAT} v{FORMAT_VERSION} manifest")
    return man


def load_checkpoint(path: str | Path, sample: bool = False, hold: int | None = None) -> Policy:
    import torch

    path = Path(path)
    man = read_manifest(path)
    nets = {}
    for cname, c in man["components"].items():
        net = build_net(c["net"])
        try:
            net.load_state_dict(torch.load(path / c["file"], map_location="cpu", weights_only=True))
        except (FileNotFoundError, RuntimeError) as e:
            raise DraftGymError(f"{path / c['file']}: cannot load ({str(e).splitlines()[0]})") from None
        net.eval()
        nets[cname] = net
    sh, name, method = man.get("shape", {}), man.get("name", path.name), man["method"]
    policy = _build_checkpoint_policy(man, nets, sh, name, method, path, sample, hold)
    policy.latency_key = latency_key(path, man)
    return policy


def latency_key(path: str | Path, man: dict | None = None) -> str:
    """'<name>-<10 hex>': the checkpoint's identity in a latency profile (`draftgym profile-policy`
    writes op = 'policy:<key>' rows; the replay charges that measured cost per call). The hash covers
    manifest.json and every weight file, so a retrained policy never inherits an old figure."""
    import hashlib

    path = Path(path)
    if path.name == "manifest.json":
        path = path.parent
    man = read_manifest(path) if man is None else man
    h = hashlib.sha256((path / "manifest.json").read_bytes())
    for c in sorted(man["components"].values(), key=lambda c: c["file"]):
        h.update((path / c["file"]).read_bytes())
    return f"{man.get('name', path.name)}-{h.hexdigest()[:10]}"


def _build_checkpoint_policy(man, nets, sh, name, method, path, sample, hold) -> Policy:
    if method == "ltd":
        size_values = man["components"].get("size", {}).get("action", {}).get("values", obs.SIZE_ACTIONS)
        return LTDPolicy(nets.get("depth"), nets.get("size"), width=sh.get("width", 10),
                         max_depth=sh.get("max_depth", 12), verify_size=sh.get("verify_size", 60),
                         size_values=size_values, name=name, sample=sample, fixed_depth=sh.get("depth", 8))
    if method == "radar":
        a = man["components"]["radar"]["action"]
        return RadarPolicy(nets["radar"], width=sh.get("width", 10), verify_size=sh.get("verify_size", 60),
                           max_calls=a.get("max_depth", obs.RADAR_MAX_CALLS), name=name, sample=sample)
    if method == "resps":
        a = man["components"]["shape"]["action"]
        return ShapePolicy(nets["shape"], a["shapes"], hold=hold or a.get("hold", 30),
                           max_depth=sh.get("max_depth", 12), name=name, sample=sample)
    raise DraftGymError(f"{path}: unknown policy method {method!r}")


def load_policy(spec: str, logs=None, latency=None, fit_logs=None) -> Policy:
    """A policy from a checkpoint directory or a built-in name (module docstring).

    logs / latency: needed by `oracle` (dynamic programming over these logs) and `goodput`
    (fit on `fit_logs`, default `logs`)."""
    from simulator import baselines as B

    if Path(spec).is_dir() or spec.endswith("manifest.json"):
        return load_checkpoint(spec)
    name, _, arg = spec.partition(":")
    width = logs.width if logs is not None else 10
    try:
        if name == "static":
            D, W, V = (int(x) for x in arg.split(","))
            return B.StaticPolicy(D, W, V)
        if name == "ddd":
            return B.DDDPolicy(threshold=float(arg) if arg else B.DDDPolicy.threshold, width=width)
        if name == "entropy":
            return B.EntropyStopPolicy(theta=float(arg) if arg else B.EntropyStopPolicy.theta, width=width)
        if name == "random":
            return B.RandomShapePolicy(logs, seed=int(arg) if arg else 0)
        if name == "goodput":
            if latency is None or logs is None:
                raise DraftGymError("goodput needs logs and a latency model")
            return B.GoodputPolicy.fit(fit_logs if fit_logs is not None else logs, latency, width=width)
        if name == "oracle":
            if latency is None or logs is None:
                raise DraftGymError("oracle needs logs and a latency model")
            return B.OraclePolicy(logs, latency, space=arg or "static")
    except ValueError as e:
        raise DraftGymError(f"bad policy spec {spec!r}: {e}") from None
    raise DraftGymError(f"unknown policy {spec!r}: a checkpoint directory, or one of static:D,W,V, ddd[:thr], "
                        f"entropy[:theta], goodput, oracle[:static|depth], random[:seed]")


# ------------------------------------------------------------------ online adapter

_BLAS_LIMIT = []


def single_thread_blas() -> None:
    """Limit numpy's BLAS to one thread in this process, once. The online controller's products are
    batch-1 (at most [1024] x [1024, 256]); waking OpenBLAS's thread pool between two verify
    forwards cost more than the product itself (LTD's size call: 0.53 -> 0.26 ms per cycle,
    docs/adhoc/controller_profile.py). torch's own threads are not touched."""
    if not _BLAS_LIMIT:
        from threadpoolctl import threadpool_limits

        _BLAS_LIMIT.append(threadpool_limits(limits=1, user_api="blas"))


class PolicyController:
    """Runs a simulator `Policy` inside the online engine (a `pipeline.controller.Controller`, batch 1).

    The hooks turn the engine's objects (CycleContext, DraftStep, DraftPool, CycleRecord) into the
    same batched inputs the replay builds from the logs, so a policy sees identical observations
    online and offline. Offline-only policies (the oracle) are refused.
    """

    def __new__(cls, policy: Policy, max_depth: int = 12):
        from pipeline.controller import Controller, TreeShape

        if getattr(policy, "offline_only", False):
            raise DraftGymError(f"{policy.name} needs the logged future (offline only)")
        single_thread_blas()

        class _PolicyController(Controller):
            def __init__(self):
                super().__init__()
                self.policy, self.max_depth = policy, max_depth
                self.zero = np.zeros(1, np.int64)
                # observe() builds its record only for policies that read it (the base one is a no-op)
                self.observes = type(policy).observe is not Policy.observe
                # batch-1 fast paths where the policy has them (LTD, RADAR), else the batched hooks, n = 1
                self.plan_one = getattr(policy, "plan_one", None)
                self.continue_one = getattr(policy, "continue_one", None)
                self.verify_size_one = getattr(policy, "verify_size_one", None)
                self.shapes = {}            # (D, W, V) -> TreeShape, built once each

            def reset(self):
                self.calls = 0          # policy inferences, counted as the replay counts them (replay.simulate)
                self.policy.reset(1, seed=0)
                self.root = np.full(obs.RESPS_ROOT_K, np.nan, np.float32)
                self.ctx_len = 0

            def plan(self, ctx):
                self.ctx_len = ctx.context_len
                if self.plan_one is not None:
                    key = self.plan_one(ctx)
                    shape = self.shapes.get(key)
                    if shape is None:
                        shape = self.shapes[key] = TreeShape(*key)
                    return shape
                last = ctx.last
                # [6, 1]: the previous cycle's D, W, V, L, emitted, and this context length; one array
                lv = np.array([[0], [0], [0], [0], [0], [ctx.context_len]]) if last is None else np.array(
                    [[last.depth], [last.width], [last.verify_size], [last.accepted], [last.emitted], [ctx.context_len]])
                sh = self.policy.plan(PlanBatch(
                    env=self.zero, seq=self.zero, position=self.zero, cycle=np.array([ctx.cycle]),
                    context_len=lv[5], has_last=np.array([last is not None]),
                    last_depth=lv[0], last_width=lv[1], last_verify=lv[2],
                    last_accepted=lv[3], last_emitted=lv[4], last_root_scores=self.root[None]))
                self.calls += int(np.asarray(sh.calls).ravel()[0]) if sh.calls is not None else 0
                return TreeShape(int(sh.depth[0]), int(sh.width[0]), int(sh.verify[0]))

            def continue_drafting(self, step):
                if not self.policy.uses_depth_hook:
                    return True
                if self.continue_one is not None:
                    self.calls += 1
                    return self.continue_one(step)
                W, need = step.width, self.policy.step_fields
                # only the fields this policy reads (each is a tensor -> numpy copy, cold between verifies)
                pad = lambda x, n: np.concatenate([x, np.full(n - len(x), np.nan, np.float32)])[None]
                s = StepBatch(env=self.zero, depth=step.depth, width=W,
                              beam_scores=obs.to_numpy(step.beam_scores)[None] if "beam_scores" in need else None,
                              candidate_scores=pad(obs.to_numpy(step.candidate_scores), W * W)
                              if "candidate_scores" in need else None,
                              entropy=pad(obs.to_numpy(step.entropy), W) if "entropy" in need else None,
                              context_len=np.array([step.context_len]))
                self.calls += 1
                return bool(np.asarray(self.policy.continue_drafting(s))[0])

            def verify_size(self, pool, shape):
                scores = obs.to_numpy(pool.scores[0])
                W, D = pool.width, pool.depth
                if self.policy.reads_root_scores:
                    k = min(W, obs.RESPS_ROOT_K)
                    self.root = np.full(obs.RESPS_ROOT_K, np.nan, np.float32)
                    self.root[:k] = scores[:k]
                if not self.policy.uses_size_hook:
                    return shape.verify_size
                if self.verify_size_one is not None:
                    self.calls += 1
                    return self.verify_size_one(scores, D, self.ctx_len, shape.verify_size)
                # only the D drafted levels need sorting; deeper ones are all-NaN, which sort_levels
                # turns into SCORE_FLOOR rows: fill those directly (same array, ~10x less work at D = 1)
                raw = obs.level_scores_from_pool(scores, W, D, self.max_depth)     # [Dmax, W*W]
                lv = np.full(raw.shape, obs.SCORE_FLOOR, np.float32)
                lv[:D] = obs.sort_levels(raw[:D], W)
                p = PoolBatch(env=self.zero, depth=np.array([D]), width=W, level_scores=lv[None],
                              context_len=np.array([self.ctx_len]))
                self.calls += 1
                return int(np.asarray(self.policy.verify_size(p, np.array([shape.verify_size])))[0])

            def observe(self, record):
                if not self.observes:
                    return
                self.policy.observe(self.zero, {k: np.array([getattr(record, k)]) for k in
                                                    ("depth", "width", "verify_size", "accepted", "emitted",
                                                     "context_len", "t_cycle")})

        return _PolicyController()
