"""Policy networks: the MLP builder with fixed input normalisation, and numpy batch-1 forwards.

A manifest `net` spec builds a torch module (`build_net`):
    {"type": "mlp", "in": 102, "hidden": [1024], "out": 2, "obs_norm": true}     LTD, Re-SpS
    {"type": "radar_lstm", "in": 10, "hidden": 128, "mlp_hidden": 128, "out": 2}  RADAR

The simulator calls the torch module on [n, in] batches (`torch_logits`); the online controller,
batch 1 between two verify forwards, calls a numpy copy of the same function (`NumpyMLP`,
NumpyRadar), which re-copies itself when the torch weights change.
"""
from __future__ import annotations

import numpy as np

from pipeline.errors import DraftGymError


def build_net(spec: dict):
    """torch module from a manifest `net` spec."""
    import torch.nn as nn

    if spec["type"] == "mlp":
        layers, d = ([make_obs_norm(spec["in"])] if spec.get("obs_norm") else []), spec["in"]
        for h in spec["hidden"]:
            layers += [nn.Linear(d, h), nn.ReLU()]
            d = h
        layers.append(nn.Linear(d, spec["out"]))
        return nn.Sequential(*layers)
    if spec["type"] == "radar_lstm":
        return make_radar_net(spec["in"], spec.get("hidden", 128), spec.get("mlp_hidden", 128), spec.get("out", 2))
    raise DraftGymError(f"unknown net type {spec['type']!r}")


def make_obs_norm(n: int):
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
    """Set an MLP's input standardisation (`make_obs_norm`) from a sample of observations [n, dim] (constant features: std 1)."""
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
    verify forwards, and torch's per-op dispatch (~10 us per op, cold) costs LTD about 1.5 % of
    decode time; numpy's is ~1 us.

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
        if not isinstance(mods[0], nn.Linear):          # the input standardisation first
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


def make_radar_net(*a, **kw):
    """RADAR's LSTM net (`_radar_net_cls`; torch imported on first use)."""
    return _radar_net_cls()(*a, **kw)


def torch_logits(net, x: np.ndarray) -> np.ndarray:
    """The torch net on a numpy batch: x [n, in] -> logits [n, out] (no grad, fp32)."""
    import torch

    with torch.no_grad():
        return net(torch.from_numpy(np.ascontiguousarray(x, np.float32))).numpy()
