"""The per-row state of batched EAGLE-3 decoding: slot caches for the target and the head, and the
token and feature stores, preallocated and written in place at each row's own offsets.

Layout: slots, not left padding, for every store. Row r's entry for sequence index t sits at index t
of its slot, so positions are the natural ones and no row is shifted by padding; a finished row's
slot is refilled in place with a prompt of any length without moving the other rows, which left
padding cannot do (all rows share one right edge). HF's StaticCache is preallocated too but shares one
write position (cache_position) across the batch, so it cannot hold rows of different lengths
without left padding, nor refill a slot. Row r holds

    ids[r, t]      token x_t, t <= n_r             (x_{n_r} is the root: emitted, not yet in the target cache)
    target KV      entries t < n_r                 (BatchSlotKV)
    head KV        entries t < dl_r                (HeadSlotKV; entry t pairs f_t with x_{t+1})
    feat[r, t]     fused target features f_t, t < n_r; the head has not read t in [dl_r, n_r) yet
                   (its "pending" entries)

Entries past a row's own length are stale (a previous occupant's, or padding) and every forward
masks them out, so a finished row's slot is refilled in place with a prompt of any length. Writes
of whole fixed-size blocks (V verify entries, M pending entries) per row land partly past the row's
length; they are overwritten before they are ever read.

Memory: the feature store is [B, S, H] in the head's dtype, about what two of the target's layers of
KV take (Llama-3-8B: 2 x 8 x 128 K/V per token and layer against H = 4096).
"""
from __future__ import annotations

import torch

from pipeline.models.head_model import KVBuffer


def _rows_index(A: int, device) -> torch.Tensor:
    return torch.arange(A, device=device)[:, None]                            # [A, 1]


def kv_geometry(model) -> tuple[int, int, int]:
    """(layers, KV heads, head dim) of a target."""
    c = model.config
    n_heads = c.num_attention_heads
    d = getattr(c, "head_dim", None) or c.hidden_size // n_heads
    return c.num_hidden_layers, getattr(c, "num_key_value_heads", None) or n_heads, d


class BatchSlotKV:
    """The target's K/V in B slots, per layer [B, n_kv, S, d]. Duck-types the one method HF attention
    calls on a cache, `update`: a forward writes row r's q new entries at pos[r] .. pos[r] + q - 1
    (one scatter per layer) and attends over keys [0, span) under the caller's additive mask."""

    def __init__(self, n_layers: int, B: int, n_kv: int, S: int, d: int, dtype, device):
        self.k = [torch.zeros(B, n_kv, S, d, dtype=dtype, device=device) for _ in range(n_layers)]
        self.v = [torch.zeros_like(k) for k in self.k]
        self.pos = torch.zeros(B, dtype=torch.long, device=device)   # [A] write index of this forward
        self.span = 1                                                 # keys read: [0, span)
        self._flat: torch.Tensor | None = None                        # this forward's write indices (update)

    def update(self, k, v, layer_idx, *args, **kwargs):
        """k, v: [A, n_kv, q, d] -> written at (r, h, pos[r] + i); returns keys/values [A, n_kv, span, d].

        One index_copy_ into the store seen flat, [A * n_kv * S, d], at

            flat[r, h, i] = (r * n_kv + h) * S + pos[r] + i                        [A * n_kv * q]

        built once per forward (at layer 0, which every forward runs first; every layer writes there),
        in k's own element order. An advanced-index write (store[rows, :, idx] = ...) would rebuild
        its indices in every layer, a cost the batch-1 loop's DynamicCache never paid."""
        A, n_kv, q, d = k.shape
        if layer_idx == 0 or self._flat is None:                                               # a new forward
            S = self.k[0].shape[2]
            slot = torch.arange(A * n_kv, device=k.device).view(A, n_kv, 1) * S                # [A, n_kv, 1]
            at = self.pos[:, None] + torch.arange(q, device=k.device)                          # [A, q]
            self._flat = (slot + at[:, None, :]).reshape(-1)                                   # [A * n_kv * q]
        K, V = self.k[layer_idx], self.v[layer_idx]
        K.view(-1, d).index_copy_(0, self._flat, k.reshape(-1, d))
        V.view(-1, d).index_copy_(0, self._flat, v.reshape(-1, d))
        return K[:, :, : self.span], V[:, :, : self.span]

    def load(self, slot: int, cache, n: int, row: int = 0) -> None:
        """Copy row `row`'s first n entries of a DynamicCache into slot `slot`, indices [0, n)."""
        for i, layer in enumerate(cache.layers):
            self.k[i][slot, :, :n] = layer.keys[row, :, :n]
            self.v[i][slot, :, :n] = layer.values[row, :, :n]

    def compact(self, start: torch.Tensor, order: torch.Tensor) -> None:
        """Row r: entry start[r] + order[r, i] moves to start[r] + i, for i < V (the accepted path
        first, in tree order; the rest lands past the row's new length). start: [A], order: [A, V]."""
        A, V = order.shape
        rows = _rows_index(A, order.device)
        src = start[:, None] + order                                            # [A, V]
        dst = start[:, None] + torch.arange(V, device=order.device)
        for t in (*self.k, *self.v):
            t[rows, :, dst] = t[rows, :, src]                                   # the read is a copy first


class HeadSlotKV(KVBuffer):
    """The head's KV in slots: [A, n_kv, S, d]. Passed as the head's `past_kv`, a forward writes row
    r's q new entries at pos[r] .. pos[r] + q - 1 (clamped into the buffer: padding entries past a
    row's length are never read) and attends over keys [0, span) under the caller's mask."""

    def __init__(self, B: int, n_kv: int, S: int, d: int, dtype, device):
        self.keys = torch.zeros(B, n_kv, S, d, dtype=dtype, device=device)
        self.values = torch.zeros_like(self.keys)
        self.pos = torch.zeros(B, dtype=torch.long, device=device)
        self.span = 0
        self.length = 0                           # KVBuffer's shared length: unused here

    def append(self, ks: torch.Tensor, vs: torch.Tensor):
        A, q = ks.shape[0], ks.shape[2]
        idx = (self.pos[:, None] + torch.arange(q, device=ks.device)).clamp(max=self.keys.shape[2] - 1)
        rows = _rows_index(A, ks.device)
        self.keys[rows, :, idx] = ks.transpose(1, 2)
        self.values[rows, :, idx] = vs.transpose(1, 2)
        return self.keys[:, :, : self.span], self.values[:, :, : self.span]

    def prefix(self, span: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.keys[:, :, :span], self.values[:, :, :span]

    def load(self, slot: int, kv: tuple[torch.Tensor, torch.Tensor], n: int) -> None:
        """Copy a batch-1 head KV's first n entries ([1, n_kv, >= n, d]) into slot `slot`."""
        self.keys[slot, :, :n] = kv[0][0, :, :n]
        self.values[slot, :, :n] = kv[1][0, :, :n]


class BatchState:
    """Every per-row store of the batched engine, and each row's lengths n_r (target cache) and dl_r
    (head cache), on the device and mirrored on the host (the host copy sizes each step's tensors
    without a device read).

    Slots, live rows and run rows. The stores (`full`: target K/V per layer, tokens, and with
    features the head's K/V and the feature store) are made for `slots` rows and stay where they
    are while rows join and leave, so the CUDA graphs captured on them stay valid:

        live rows   slots [0, live): a row that leaves takes the last live row into its slot (one
                    copy of that row); a row that joins takes slot `live`
        run rows    slots [0, rows), rows = pad(live) >= live: what a step computes over. The
                    attributes kv.k, kv.v, ids, feat, hkv.* are views of the first `rows` slots
                    (same addresses as the stores). The pad rows [live, rows) hold n = dl = 1 and
                    compute values nobody reads; their writes land in their own free slots.

    pad is the identity without CUDA graphs and rounds up to a capture size with them
    (pipeline/decode/engine/core.py `row_bucket`), so a step over 5 live rows replays the graph of
    8 rows instead of capturing one for 5. The host lists n_host, dl_host cover the run rows.

    features=False (AR at batch B): no head cache and no feature store."""

    PAD = 1                                 # n = dl of a pad row: one entry, nothing pending
    S_DIM = {"k": 2, "v": 2, "ids": 1, "hk": 2, "hv": 2, "feat": 1}     # each store's entry (capacity) dim

    def __init__(self, model, head, slots: int, S: int, features: bool, pad=None):
        dev = next(model.parameters()).device
        n_layers, n_kv, d = kv_geometry(model)
        self.device, self.pad = dev, pad or _same
        self.kv = BatchSlotKV(n_layers, slots, n_kv, S, d, next(model.parameters()).dtype, dev)
        self.full = {"k": self.kv.k, "v": self.kv.v, "ids": [torch.zeros(slots, S, dtype=torch.long, device=dev)]}
        self.hkv = self.feat = None
        if features:
            c = head.cfg
            self.hkv = HeadSlotKV(slots, c.num_key_value_heads, S, c.dim_head, head.dtype, dev)
            self.full |= {"hk": [self.hkv.keys], "hv": [self.hkv.values],
                          "feat": [torch.zeros(slots, S, c.hidden_size, dtype=head.dtype, device=dev)]}  # [slots, S, H]
        self.live, self.n_host, self.dl_host = 0, [], []
        self.add(slots)                                                         # every slot live, to be loaded

    @property
    def rows(self) -> int:
        """The run rows a step computes over (live rows + pad rows)."""
        return self.ids.shape[0]

    @property
    def slots(self) -> int:
        return self.full["ids"][0].shape[0]

    @property
    def capacity(self) -> int:
        return self.full["ids"][0].shape[1]

    def _view(self, R: int) -> None:
        """The step's tensors: views of the first R slots; n, dl from the host lists (pad rows: PAD)."""
        f, dev = self.full, self.device
        self.kv.k, self.kv.v = [t[:R] for t in f["k"]], [t[:R] for t in f["v"]]
        self.kv.pos = torch.zeros(R, dtype=torch.long, device=dev)
        self.ids = f["ids"][0][:R]                                              # [R, S]
        if self.hkv is not None:
            self.hkv.keys, self.hkv.values = f["hk"][0][:R], f["hv"][0][:R]
            self.hkv.pos = torch.zeros(R, dtype=torch.long, device=dev)
            self.feat = f["feat"][0][:R]                                        # [R, S, H]
        pads = [self.PAD] * (R - self.live)
        self.n_host, self.dl_host = self.n_host[: self.live] + pads, self.dl_host[: self.live] + pads
        self.n = torch.tensor(self.n_host, dtype=torch.long, device=dev)        # [R]
        self.dl = torch.tensor(self.dl_host, dtype=torch.long, device=dev)      # [R]

    def alias(self, live: int) -> "BatchState":
        """A state over the same stores (the engine's static caches, reused call after call) with
        `live` rows to be loaded. It shares `full`: stores it grows are grown for the original too."""
        new = object.__new__(BatchState)
        new.__dict__.update(self.__dict__)
        new.kv = object.__new__(type(self.kv))
        new.kv.__dict__.update(self.kv.__dict__)
        if self.hkv is not None:
            new.hkv = object.__new__(type(self.hkv))
            new.hkv.__dict__.update(self.hkv.__dict__)
        new.live, new.n_host, new.dl_host = 0, [], []
        new.add(live)
        return new

    def buffers(self) -> tuple[int, ...]:
        """The addresses of every store a step writes or reads in place: a CUDA graph of a step part
        is valid exactly while these are unchanged (pipeline/runtime/cuda_graphs.py)."""
        return tuple(t.data_ptr() for ts in self.full.values() for t in ts)

    def load(self, slot: int, seq: list[int], cache, n: int, head_kv=None, dl: int = 0,
             feats: torch.Tensor | None = None, row: int = 0) -> None:
        """A new row in `slot`: tokens seq (prompt + first token, len n + 1), the target's cache (row
        `row` of a prefill's DynamicCache, n entries), the head's batch-1 KV (dl entries) and features
        f_0 .. f_{n-1} [1, n, H]."""
        self.kv.load(slot, cache, n, row)
        self.ids[slot, : len(seq)] = torch.tensor(seq, device=self.ids.device)
        self.n[slot], self.n_host[slot] = n, n
        self.dl[slot], self.dl_host[slot] = dl, dl
        if self.feat is not None:
            self.feat[slot, :n] = feats[0, :n]
            if dl:
                self.hkv.load(slot, head_kv, dl)

    def keep(self, keep: list[int]) -> list[int]:
        """Keep the live slots `keep` (ascending) only: each one at or past len(keep) moves into a
        slot below it that lost its row (one copy of the moved rows, in place). Returns, per new
        slot, the old slot its row came from (Rows.keep takes it)."""
        L, kept = len(keep), set(keep)
        holes = [i for i in range(L) if i not in kept]
        movers = [j for j in keep if j >= L]
        order = list(range(L))
        if holes:
            dst, src = (torch.tensor(x, dtype=torch.long, device=self.device) for x in (holes, movers))
            for ts in self.full.values():
                for t in ts:
                    t[dst] = t[src]                                             # the read is a copy first
            for h, m in zip(holes, movers):
                order[h] = m
                self.n_host[h], self.dl_host[h] = self.n_host[m], self.dl_host[m]
        self.live = L
        self._view(self.pad(L))
        return order

    def add(self, k: int) -> None:
        """k more live rows, slots [live, live + k) (more slots made when the stores are short: a
        copy). The caller loads each before the next forward."""
        live = self.live + k
        if self.pad(live) > self.slots:
            self._resize(slots=self.pad(live))
        self.n_host, self.dl_host = self.n_host[: self.live] + [0] * k, self.dl_host[: self.live] + [0] * k
        self.live = live
        self._view(self.pad(live))

    def ensure(self, need: int) -> None:
        """Room for index need - 1 in every store (grown by at least half when short)."""
        if need > self.capacity:
            self._resize(S=max(need, self.capacity + self.capacity // 2))
            self._view(self.rows)

    def _resize(self, slots: int = 0, S: int = 0) -> None:
        """Bigger stores (a copy: new addresses, so the graphs on the old ones are not replayed); the
        caller takes its views anew."""
        for name, ts in self.full.items():
            ts[:] = [_grow(_grow(t, 0, slots), self.S_DIM[name], S) for t in ts]


def _same(a: int) -> int:
    return a


def _grow(t: torch.Tensor, dim: int, S: int) -> torch.Tensor:
    if t.shape[dim] >= S:
        return t
    shape = list(t.shape)
    shape[dim] = S - t.shape[dim]
    return torch.cat([t, t.new_zeros(shape)], dim)
