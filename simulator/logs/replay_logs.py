"""Load collected logs (positions + sequences) into flat numpy arrays for vectorised replay.

Layout (pipeline/logs/schema.py): <logs>/{sequences,positions}/model=M/dataset=D/temperature=T/*.parquet.
One `ReplayLogs` holds one (model, temperature), any set of datasets and splits, and one or more
widths W. Rows are positions, ordered by (sequence, position):

    row(s, p) = offsets[s] + p          p = 0 .. new_tokens[s] - 2  (the root of the cycle is y_p)

Per row: context_len [N]; per width (`logs.w[W]`, a `WidthArrays`):
    acceptance       [N, Dmax, G] uint8    L for the static tree (D, W, verify_grid[g])
    beam_scores      [N, Dmax, W] float32
    candidate_scores [N, Dmax, W*W] float32, per level sorted best first, floored at -20 (the form the
                     observations read; pipeline/logs/candidates.py)
    entropy          [N, Dmax, W] float32
    accept_dist      [N, Dmax, Dmax+1] float32 or None (T > 0 only)
The primary width's arrays are also reachable as logs.acceptance, logs.beam_scores, ...

The checked reads are simulator.logs.read (a corrupt, truncated or foreign file, a selection the logs
do not hold, inconsistent configs: a one-line `DataError`); here they are assembled into arrays, checked
to cover positions 0 .. new_tokens - 2 of every sequence exactly once.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path

import numpy as np

from pipeline.errors import DataError
from pipeline.logs.candidates import sort_desc, sorted_levels
from simulator.logs.read import LogRows, SequenceColumns, read_logs


@dataclass
class WidthArrays:
    width: int
    acceptance: np.ndarray         # [N, Dmax, G] uint8
    beam_scores: np.ndarray        # [N, Dmax, W]
    levels: np.ndarray | None      # [N, Dmax, W*W] sorted candidate levels, or None until first read (from tail)
    entropy: np.ndarray            # [N, Dmax, W]
    accept_dist: np.ndarray | None = None   # [N, Dmax, Dmax+1] (NaN rows where not logged)
    tail: np.ndarray | None = None          # [N, Dmax, W*W - W] float16 (schema version 3) while levels is None;
                                            # both None: read without candidates (read.NO_CANDIDATES)

    @property
    def candidate_scores(self) -> np.ndarray:
        """[N, Dmax, W*W] float32 per level: sorted best first, floored (pipeline/logs/candidates.py). Version-3
        logs keep the float16 tail (2,160 bytes a position at W = 10, not 4,800) until this is first read:
        replay without a policy that reads candidates (static, grid-best, oracle, DDD, entropy, RADAR) never
        builds it."""
        if self.levels is None:
            if self.tail is None:
                raise RuntimeError("these logs were read without their candidates (read.NO_CANDIDATES): "
                                   "a policy that reads candidate scores needs them read")
            self.levels, self.tail = sorted_levels(self.beam_scores, self.tail), None
        return self.levels

    @property
    def sorted_candidates(self) -> np.ndarray:
        """= `observations.sort_levels(candidate_scores)`: the logs hold them sorted already (the order
        within a level is not kept: nothing reads it)."""
        return self.candidate_scores

    def root_scores(self, rows: np.ndarray, k: int) -> np.ndarray:
        """[len(rows), k] = candidate_scores[rows, 0, :k]: the root's best children, which are level 1's
        beams (read from the beams while the levels are not built)."""
        if self.levels is not None:
            return self.levels[rows, 0, :k]
        return sort_desc(self.beam_scores[rows, 0])[:, :k]

    def take(self, rows: np.ndarray) -> "WidthArrays":
        lazy = self.levels is None
        return WidthArrays(self.width, self.acceptance[rows], self.beam_scores[rows],
                           None if lazy else self.levels[rows], self.entropy[rows],
                           None if self.accept_dist is None else self.accept_dist[rows],
                           None if self.tail is None else self.tail[rows])


@dataclass
class ReplayLogs:
    model: str
    temperature: float
    width: int                       # primary W
    max_depth: int
    verify_grid: np.ndarray          # [G] int
    # per sequence [S]
    prompt_id: np.ndarray
    run_key: np.ndarray
    dataset: np.ndarray
    split: np.ndarray
    new_tokens: np.ndarray           # int64, T: the episode emits T - 1 tokens in cycles (y_0 is the prefill's)
    prompt_len: np.ndarray
    offsets: np.ndarray              # [S+1] int64
    # per row [N]
    seq_index: np.ndarray
    position: np.ndarray
    context_len: np.ndarray
    w: dict[int, WidthArrays] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    dtype: str = "float32"           # the target's compute dtype the logs were collected in
    source_index: np.ndarray | None = None   # [S] each sequence's index in the selection it was read from

    # -- shapes and lookups
    @property
    def n_sequences(self) -> int:
        return len(self.new_tokens)

    @property
    def n_positions(self) -> int:
        return len(self.context_len)

    @property
    def widths(self) -> tuple[int, ...]:
        return tuple(self.w)

    @property
    def datasets(self) -> list[str]:
        return sorted(set(self.dataset.tolist()))

    @property
    def acceptance(self) -> np.ndarray:
        return self.w[self.width].acceptance

    @property
    def beam_scores(self) -> np.ndarray:
        return self.w[self.width].beam_scores

    @property
    def candidate_scores(self) -> np.ndarray:
        return self.w[self.width].candidate_scores

    @property
    def entropy(self) -> np.ndarray:
        return self.w[self.width].entropy

    @property
    def accept_dist(self) -> np.ndarray | None:
        return self.w[self.width].accept_dist

    def row(self, seq, p) -> np.ndarray:
        return self.offsets[np.asarray(seq)] + np.asarray(p)

    def rows_of(self, seq: int) -> slice:
        return slice(int(self.offsets[seq]), int(self.offsets[seq + 1]))

    @cached_property
    def _grid_lookup(self) -> np.ndarray:
        lut = np.full(int(self.verify_grid.max()) + 1, -1, np.int64)
        lut[self.verify_grid] = np.arange(len(self.verify_grid))
        return lut

    def grid_index(self, verify_size) -> np.ndarray:
        """Exact index of V in verify_grid; ValueError for V off the grid (replay would not be exact)."""
        v = np.asarray(verify_size, np.int64)
        ok = (v >= 0) & (v < len(self._grid_lookup))
        idx = np.where(ok, self._grid_lookup[np.clip(v, 0, len(self._grid_lookup) - 1)], -1)
        if np.any(idx < 0):
            bad = sorted(set(np.asarray(v)[idx < 0].ravel().tolist()))
            raise ValueError(f"verify size(s) {bad} not on the logged grid {self.verify_grid.tolist()}")
        return idx

    def snap_to_grid(self, verify_size) -> np.ndarray:
        """Nearest grid V (ties to the smaller): for action sets defined off the grid (Re-SpS)."""
        v = np.asarray(verify_size, np.float64)
        g = self.verify_grid.astype(np.float64)
        return self.verify_grid[np.argmin(np.abs(v[..., None] - g) + 1e-9 * g, axis=-1)]

    # -- selection
    def subset(self, keep: np.ndarray) -> "ReplayLogs":
        """Keep the sequences where `keep` ([S] bool) is true, or, given integer indices, those
        sequences in that order."""
        keep = np.asarray(keep)
        seqs = np.flatnonzero(keep) if keep.dtype == bool else keep.astype(np.int64)
        lengths = (self.offsets[1:] - self.offsets[:-1])[seqs]
        rows = np.concatenate([np.arange(self.offsets[s], self.offsets[s + 1]) for s in seqs]) if len(seqs) else \
            np.zeros(0, np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        return replace(self, prompt_id=self.prompt_id[seqs], run_key=self.run_key[seqs], dataset=self.dataset[seqs],
                       split=self.split[seqs], new_tokens=self.new_tokens[seqs], prompt_len=self.prompt_len[seqs],
                       offsets=offsets, seq_index=np.repeat(np.arange(len(seqs)), lengths),
                       position=self.position[rows], context_len=self.context_len[rows],
                       w={W: a.take(rows) for W, a in self.w.items()}, notes=list(self.notes),
                       source_index=None if self.source_index is None else self.source_index[seqs])

    def select(self, split: str | list[str] | None = None, datasets: list[str] | None = None) -> "ReplayLogs":
        keep = np.ones(self.n_sequences, bool)
        if split not in (None, "all"):
            splits = [split] if isinstance(split, str) else list(split)
            keep &= np.isin(self.split, splits)
        if datasets:
            keep &= np.isin(self.dataset, list(datasets))
        if keep.all():                   # everything: the same arrays, no copy (a 500k-row chunk is GBs)
            return replace(self, notes=list(self.notes))
        return self.subset(keep)

    def with_width(self, width: int) -> "ReplayLogs":
        if width not in self.w:
            raise DataError(f"width {width} not in the loaded logs (widths {list(self.w)})")
        return replace(self, width=width)

    def summary(self) -> dict:
        return {"model": self.model, "temperature": self.temperature, "widths": list(self.widths),
                "max_depth": self.max_depth, "verify_grid": self.verify_grid.tolist(),
                "sequences": self.n_sequences, "positions": self.n_positions, "datasets": self.datasets,
                "splits": sorted(set(self.split.tolist()))}


def load_logs(root: str | Path, model: str | None = None, temperature: float | None = None,
              datasets: list[str] | str | None = None, split: str | list[str] | None = None,
              width: int | None = None, widths: list[int] | None = None, dtype: str | None = None) -> ReplayLogs:
    """Read and check the logs of one (model, temperature, dtype) for the given datasets, split(s), width(s).

    model / temperature / dtype may be omitted when the logs hold only one (acceptance in bf16 and
    in fp32 differ after the first near-tie, so one replay never mixes them). width: the primary W (default:
    10 if logged, else the smallest logged); widths: extra widths to load too (e.g. for Re-SpS
    shapes); "all" loads every logged width.
    """
    return assemble(read_logs(root, model, temperature, datasets, split, width, widths, dtype))


def assemble(r: LogRows, only_present: bool = False) -> ReplayLogs:
    """ReplayLogs from checked rows: every selected sequence (each must be covered), or with
    only_present those that have rows in `r` (a chunk of a selection read a few files at a time;
    `ReplayLogs.source_index` says which sequences of the selection they are)."""
    source = np.arange(len(r.sequences.new_tokens))
    if only_present:
        seen = [x for a in r.positions.values() for x in a["seq"]]
        source = np.unique(np.concatenate(seen)) if seen else np.zeros(0, np.int64)
        local = np.full(len(r.sequences.new_tokens), -1, np.int64)
        local[source] = np.arange(len(source))
        r = replace(r, sequences=r.sequences.take(source), splits=r.splits[source],
                    positions={W: {**a, "seq": [local[x] for x in a["seq"]]} for W, a in r.positions.items()})
    sq = r.sequences
    warr, index = {}, []
    for W, a in r.positions.items():
        warr[W], idx = _width_arrays(a, W, sq)
        index.append(idx)
    seq_i, pos, ctx, offsets = index[0]           # every width covers the same rows (checked)
    logs = ReplayLogs(model=r.model, temperature=r.temperature, width=r.width, max_depth=r.max_depth,
                      verify_grid=r.verify_grid, prompt_id=sq.prompt_id, run_key=sq.run_key, dataset=sq.dataset,
                      split=r.splits, new_tokens=sq.new_tokens, prompt_len=sq.prompt_len,
                      offsets=offsets.astype(np.int64), seq_index=seq_i, position=pos, context_len=ctx, w=warr,
                      notes=[], dtype=r.dtype, source_index=source)
    short = sq.new_tokens <= 1
    if short.any():
        logs.notes.append(f"{int(short.sum())} sequences with new_tokens <= 1 (nothing to draft) dropped")
        logs = logs.subset(~short)
    return logs


def _width_arrays(a: dict[str, list], W: int, sq: SequenceColumns):
    """One width's rows ordered by (sequence, position), checked to cover positions 0..T-2 of every
    sequence once. Returns (WidthArrays, (seq_index, position, context_len, offsets))."""
    if not a["seq"]:
        raise DataError(f"no positions rows of width {W} for the selected sequences")
    need_len = np.maximum(sq.new_tokens - 1, 0)
    seq_i, pos, ctx = (np.concatenate(a[k]) for k in ("seq", "pos", "ctx"))
    inrange = pos < need_len[seq_i]                       # rows past T-2 are never a cycle's root
    order = np.lexsort((pos, seq_i))
    order = order[inrange[order]]
    seq_i, pos, ctx = seq_i[order], pos[order], ctx[order]
    counts = np.bincount(seq_i, minlength=len(sq.new_tokens))
    bad = np.flatnonzero(counts != need_len)
    if len(bad):
        s = bad[0]
        raise DataError(f"sequence {sq.prompt_id[s]} ({sq.dataset[s]}) has {counts[s]} positions rows of width {W}, "
                        f"expected {need_len[s]} (positions 0..new_tokens-2); {len(bad)} sequence(s) affected")
    offsets = np.concatenate([[0], np.cumsum(need_len)])
    expect = np.arange(len(pos)) - np.repeat(offsets[:-1], need_len)
    if not np.array_equal(pos, expect):
        raise DataError(f"duplicate or missing positions in width-{W} rows")
    identity = len(order) == sum(len(x) for x in a["seq"]) and np.array_equal(order, np.arange(len(order)))

    def cat(k):                   # rows in (sequence, position) order; no copy when they already are
        x = a[k][0] if len(a[k]) == 1 else np.concatenate(a[k])
        a[k] = []                     # the per-file arrays are freed as soon as they are joined
        return x if identity else x[order]

    dist = None if any(x is None for x in a["dist"]) else cat("dist")
    if any(c is None for c in a["cand"]) and not all(c is None for c in a["cand"]):    # version 2 and 3 files
        a["cand"] = [sorted_levels(b, t) if c is None else c for b, t, c in zip(a["beam"], a["tail"], a["cand"])]
    levels = None if a["cand"][0] is None else cat("cand")
    tail = cat("tail") if levels is None and a["tail"][0] is not None else None
    arrays = WidthArrays(W, cat("acc"), cat("beam"), levels, cat("ent"), dist, tail)
    return arrays, (seq_i, pos, ctx, offsets)
