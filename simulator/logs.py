"""Load collected logs (positions + sequences) into flat numpy arrays for vectorised replay.

Layout (pipeline/schema.py): <logs>/{sequences,positions}/model=M/dataset=D/temperature=T/*.parquet.
One `ReplayLogs` holds one (model, temperature), any set of datasets and splits, and one or more
widths W. Rows are positions, ordered by (sequence, position):

    row(s, p) = offsets[s] + p          p = 0 .. new_tokens[s] - 2  (the root of the cycle is y_p)

Per row: context_len [N]; per width (`logs.w[W]`, a `WidthArrays`):
    acceptance       [N, Dmax, G] uint8    L for the static tree (D, W, verify_grid[g])
    beam_scores      [N, Dmax, W] float32
    candidate_scores [N, Dmax, W*W] float32 (NaN where the schema says NaN)
    entropy          [N, Dmax, W] float32
    accept_dist      [N, Dmax, Dmax+1] float32 or None (T > 0 only)
The primary width's arrays are also reachable as logs.acceptance, logs.beam_scores, ...

Every file read goes through `pipeline.schema.read_table` (checked): a corrupt, truncated or
foreign file raises a one-line `DataError`; so do missing positions and inconsistent configs.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path

import numpy as np
import pyarrow as pa

from pipeline.errors import DataError
from pipeline.schema import PARTITIONS, read_table
from pipeline.storage import local_dir

_PART_RE = re.compile(r"^(model|dataset|temperature)=(.*)$")


def safe_name(s: str) -> str:
    """The path-safe spelling `partition_dir` uses."""
    return str(s).replace("/", "--").replace("=", "-")


def partition_values(path: Path) -> dict[str, str]:
    out = {}
    for part in path.parts:
        m = _PART_RE.match(part)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def discover(root: str | Path) -> list[dict]:
    """Partitions of the sequences table: [{'model', 'dataset', 'temperature', 'dir'}]. root: a local
    directory or a file:// URI (s3:// and gs:// are refused with one line: copy them locally first)."""
    root = local_dir(root, "the simulator")
    base = root / "sequences"
    if not base.is_dir():
        raise DataError(f"no sequences table under {root} (expected {base}/model=.../dataset=.../temperature=...)")
    found = []
    for d in sorted(base.glob("model=*/dataset=*/temperature=*")):
        if d.is_dir() and any(p for p in d.glob("*.parquet") if not p.name.startswith(".")):
            v = partition_values(d)
            found.append({"model": v["model"], "dataset": v["dataset"], "temperature": float(v["temperature"]),
                          "dir": d})
    if not found:
        raise DataError(f"no sequences shards under {base}")
    return found


def _fixed_list(col: pa.ChunkedArray | pa.Array, shape: tuple[int, ...], dtype) -> np.ndarray:
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if len(arr) == 0:
        return np.zeros((0,) + shape, dtype)
    flat = np.asarray(arr.flatten().to_numpy(zero_copy_only=False), dtype=dtype)
    if arr.null_count == 0:
        return flat.reshape((len(arr),) + shape)
    # null rows (e.g. accept_dist subsampled out by --dist-every): NaN (float) / 0 (int)
    out = np.full((len(arr),) + shape, np.nan if np.issubdtype(dtype, np.floating) else 0, dtype)
    out[np.asarray(arr.is_valid())] = flat.reshape((-1,) + shape)
    return out


@dataclass
class WidthArrays:
    width: int
    acceptance: np.ndarray         # [N, Dmax, G] uint8
    beam_scores: np.ndarray        # [N, Dmax, W]
    candidate_scores: np.ndarray   # [N, Dmax, W*W]
    entropy: np.ndarray            # [N, Dmax, W]
    accept_dist: np.ndarray | None = None   # [N, Dmax, Dmax+1] (NaN rows where not logged)

    def take(self, rows: np.ndarray) -> "WidthArrays":
        return WidthArrays(self.width, self.acceptance[rows], self.beam_scores[rows], self.candidate_scores[rows],
                           self.entropy[rows], None if self.accept_dist is None else self.accept_dist[rows])

    @cached_property
    def sorted_candidates(self) -> np.ndarray:
        """[N, Dmax, W*W] per-level `observations.sort_desc` of candidate_scores (computed once)."""
        from simulator.observations import sort_levels

        return sort_levels(self.candidate_scores, self.width)


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
        """Keep the sequences where `keep` ([S] bool) is true."""
        keep = np.asarray(keep, bool)
        seqs = np.flatnonzero(keep)
        lengths = (self.offsets[1:] - self.offsets[:-1])[seqs]
        rows = np.concatenate([np.arange(self.offsets[s], self.offsets[s + 1]) for s in seqs]) if len(seqs) else \
            np.zeros(0, np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        return replace(self, prompt_id=self.prompt_id[seqs], run_key=self.run_key[seqs], dataset=self.dataset[seqs],
                       split=self.split[seqs], new_tokens=self.new_tokens[seqs], prompt_len=self.prompt_len[seqs],
                       offsets=offsets, seq_index=np.repeat(np.arange(len(seqs)), lengths),
                       position=self.position[rows], context_len=self.context_len[rows],
                       w={W: a.take(rows) for W, a in self.w.items()}, notes=list(self.notes))

    def select(self, split: str | list[str] | None = None, datasets: list[str] | None = None) -> "ReplayLogs":
        keep = np.ones(self.n_sequences, bool)
        if split not in (None, "all"):
            splits = [split] if isinstance(split, str) else list(split)
            keep &= np.isin(self.split, splits)
        if datasets:
            keep &= np.isin(self.dataset, list(datasets))
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


def _pick(name: str, wanted, available: list, match=lambda w, a: w == a):
    if wanted is None:
        if len(available) != 1:
            raise DataError(f"several {name}s in the logs ({', '.join(map(str, available))}); choose one")
        return available[0]
    for a in available:
        if match(wanted, a):
            return a
    raise DataError(f"{name} {wanted!r} not in the logs (have {', '.join(map(str, available))})")


def load_logs(root: str | Path, model: str | None = None, temperature: float | None = None,
              datasets: list[str] | str | None = None, split: str | list[str] | None = None,
              width: int | None = None, widths: list[int] | None = None, dtype: str | None = None) -> ReplayLogs:
    """Read and check the logs of one (model, temperature, dtype) for the given datasets, split(s), width(s).

    model / temperature / dtype may be omitted when the logs hold only one (acceptance in bf16 and
    in fp32 differ after the first near-tie, so one replay never mixes them). width: the primary W (default:
    10 if logged, else the smallest logged); widths: extra widths to load too (e.g. for Re-SpS
    shapes); "all" loads every logged width.
    """
    root = local_dir(root, "the simulator")
    parts = discover(root)
    model = _pick("model", model, sorted({p["model"] for p in parts}), lambda w, a: safe_name(w) == a or w == a)
    parts = [p for p in parts if p["model"] == model]
    temperature = _pick("temperature", temperature, sorted({p["temperature"] for p in parts}),
                        lambda w, a: abs(float(w) - a) < 1e-9)
    parts = [p for p in parts if p["temperature"] == temperature]
    have = sorted({p["dataset"] for p in parts})
    if isinstance(datasets, str):
        datasets = [d for d in datasets.split(",") if d]
    if datasets:
        missing = [d for d in datasets if safe_name(d) not in have]
        if missing:
            raise DataError(f"dataset(s) {missing} not in the logs for model={model} temperature={temperature:g} "
                            f"(have {have})")
        parts = [p for p in parts if p["dataset"] in {safe_name(d) for d in datasets}]

    # ---- sequences
    seq_tables = []
    for p in parts:
        for f in sorted(x for x in p["dir"].glob("*.parquet") if not x.name.startswith(".")):
            t = read_table(f, "sequences", columns=["run_key", "prompt_id", "split", "model_id", "dtype", "prompt_tokens",
                                                   "new_tokens", "widths", "max_depth", "verify_grid"])
            t = t.append_column("dataset", pa.array([p["dataset"]] * len(t), pa.string()))
            seq_tables.append(t)
    seqs = pa.concat_tables(seq_tables) if seq_tables else None
    if seqs is None or len(seqs) == 0:
        raise DataError(f"no sequences for model={model} temperature={temperature:g} under {root}")
    dtypes = np.array(seqs.column("dtype").to_pylist(), dtype=object)
    have_dt = sorted(set(dtypes.tolist()))
    if dtype is None:
        if len(have_dt) > 1:
            raise DataError(f"the logs for model={model} temperature={temperature:g} hold several dtypes ({', '.join(have_dt)}); "
                            f"choose one with --dtype")
        dtype = have_dt[0]
    elif dtype not in have_dt:
        raise DataError(f"no {dtype} logs for model={model} temperature={temperature:g} under {root} (have {', '.join(have_dt)})")
    splits = np.array(seqs.column("split").to_pylist(), dtype=object)
    splits = np.where(splits == None, "none", splits)  # noqa: E711
    keep = dtypes == dtype
    if split not in (None, "all"):
        keep &= np.isin(splits, [split] if isinstance(split, str) else list(split))
    if not keep.any():
        raise DataError(f"no sequences in split {split!r} (splits present: {sorted(set(splits.tolist()))})")
    idx = np.flatnonzero(keep)
    seqs = seqs.take(pa.array(idx))
    splits = splits[idx]
    max_depths = set(seqs.column("max_depth").to_pylist())
    grids = {tuple(g) for g in seqs.column("verify_grid").to_pylist()}
    if len(max_depths) != 1 or len(grids) != 1:
        raise DataError(f"the selected sequences mix collection configs (max_depth {sorted(max_depths)}, "
                        f"{len(grids)} verify grids); select one run")
    max_depth, grid = int(max_depths.pop()), np.array(grids.pop(), np.int64)
    seq_widths = [set(w) for w in seqs.column("widths").to_pylist()]
    common = sorted(set.intersection(*seq_widths))
    if not common:
        raise DataError("the selected sequences share no logged width")
    if width is None:
        width = 10 if 10 in common else common[0]
    if width not in common:
        raise DataError(f"width {width} not logged for every selected sequence (common widths: {common})")
    if widths == "all":
        want = common
    else:
        want = sorted({width, *(widths or [])})
        bad = [x for x in want if x not in common]
        if bad:
            raise DataError(f"width(s) {bad} not logged for every selected sequence (common widths: {common})")

    run_key = np.array(seqs.column("run_key").to_pylist(), dtype=object)
    prompt_id = np.array(seqs.column("prompt_id").to_pylist(), dtype=object)
    dataset = np.array(seqs.column("dataset").to_pylist(), dtype=object)
    new_tokens = np.asarray(seqs.column("new_tokens").to_numpy(), np.int64)
    prompt_len = np.array([len(x) for x in seqs.column("prompt_tokens").to_pylist()], np.int64)
    keys = list(zip(run_key.tolist(), prompt_id.tolist()))
    if len(set(keys)) != len(keys):
        raise DataError("duplicate (run_key, prompt_id) rows in the sequences table")
    notes = []
    short = new_tokens <= 1
    if short.any():
        notes.append(f"{int(short.sum())} sequences with new_tokens <= 1 (nothing to draft) dropped")
    key_to_seq = {k: i for i, k in enumerate(keys)}

    # ---- positions
    G, Dm = len(grid), max_depth
    per_w: dict[int, dict[str, list]] = {W: {k: [] for k in ("seq", "pos", "ctx", "acc", "beam", "cand", "ent",
                                                                  "dist")} for W in want}
    pos_dirs = [Path(root) / "positions" / p["dir"].relative_to(Path(root) / "sequences") for p in parts]
    n_files = 0
    for d in pos_dirs:
        for f in sorted(x for x in d.glob("*.parquet") if not x.name.startswith(".")) if d.is_dir() else []:
            n_files += 1
            t = read_table(f, "positions")
            names = set(t.column_names)
            need = {"run_key", "prompt_id", "position", "context_len", "width", "acceptance", "beam_scores",
                    "candidate_scores", "entropy"}
            if not need <= names:
                raise DataError(f"{f}: positions file lacks columns {sorted(need - names)}")
            wcol = np.asarray(t.column("width").to_numpy(), np.int64)
            for W in want:
                m = wcol == W
                if not m.any():
                    continue
                tw = t.filter(pa.array(m))
                rk, pid = tw.column("run_key").to_pylist(), tw.column("prompt_id").to_pylist()
                sidx = np.array([key_to_seq.get(k, -1) for k in zip(rk, pid)], np.int64)
                sel = sidx >= 0
                if not sel.any():
                    continue
                if not sel.all():
                    tw, sidx = tw.filter(pa.array(sel)), sidx[sel]
                try:
                    acc = _fixed_list(tw.column("acceptance"), (Dm, G), np.uint8)
                    beam = _fixed_list(tw.column("beam_scores"), (Dm, W), np.float32)
                    cand = _fixed_list(tw.column("candidate_scores"), (Dm, W * W), np.float32)
                    ent = _fixed_list(tw.column("entropy"), (Dm, W), np.float32)
                    dist = (_fixed_list(tw.column("accept_dist"), (Dm, Dm + 1), np.float32)
                            if "accept_dist" in names else None)
                except ValueError as e:
                    raise DataError(f"{f}: list sizes do not match max_depth={Dm}, W={W}, grid={G} ({e})") from None
                a = per_w[W]
                a["seq"].append(sidx)
                a["pos"].append(np.asarray(tw.column("position").to_numpy(), np.int64))
                a["ctx"].append(np.asarray(tw.column("context_len").to_numpy(), np.int64))
                a["acc"].append(acc); a["beam"].append(beam); a["cand"].append(cand); a["ent"].append(ent)
                a["dist"].append(dist)
    if n_files == 0:
        raise DataError(f"no positions shards for model={model} temperature={temperature:g} under {root}/positions")

    # ---- order rows by (sequence, position) and check coverage: positions 0..T-2 of every sequence
    need_len = np.maximum(new_tokens - 1, 0)
    warr: dict[int, WidthArrays] = {}
    ref_ctx = None
    for W in want:
        a = per_w[W]
        if not a["seq"]:
            raise DataError(f"no positions rows of width {W} for the selected sequences")
        seq_i, pos, ctx = (np.concatenate(a[k]) for k in ("seq", "pos", "ctx"))
        inrange = pos < need_len[seq_i]                       # rows past T-2 are never a cycle's root
        order = np.lexsort((pos, seq_i))
        order = order[inrange[order]]
        seq_i, pos, ctx = seq_i[order], pos[order], ctx[order]
        counts = np.bincount(seq_i, minlength=len(new_tokens))
        bad = np.flatnonzero(counts != need_len)
        if len(bad):
            s = bad[0]
            raise DataError(f"sequence {prompt_id[s]} ({dataset[s]}) has {counts[s]} positions rows of width {W}, "
                            f"expected {need_len[s]} (positions 0..new_tokens-2); {len(bad)} sequence(s) affected")
        offsets = np.concatenate([[0], np.cumsum(need_len)])
        expect = np.arange(len(pos)) - np.repeat(offsets[:-1], need_len)
        if not np.array_equal(pos, expect):
            raise DataError(f"duplicate or missing positions in width-{W} rows")
        cat = lambda k: np.concatenate(a[k])[order]
        dist = None if any(x is None for x in a["dist"]) else cat("dist")
        warr[W] = WidthArrays(W, cat("acc"), cat("beam"), cat("cand"), cat("ent"), dist)
        if ref_ctx is None:
            ref_ctx = (seq_i, pos, ctx, offsets)
    seq_i, pos, ctx, offsets = ref_ctx
    logs = ReplayLogs(model=model, temperature=float(temperature), width=width, max_depth=max_depth,
                      verify_grid=grid, prompt_id=prompt_id, run_key=run_key, dataset=dataset, split=splits,
                      new_tokens=new_tokens, prompt_len=prompt_len, offsets=offsets.astype(np.int64),
                      seq_index=seq_i, position=pos, context_len=ctx, w=warr, notes=notes, dtype=dtype)
    if short.any():
        logs = logs.subset(~short)
    return logs


def list_runs(root: str | Path) -> list[dict]:
    """[(model, dataset, temperature)] partitions present, for CLI messages."""
    return [{k: p[k] for k in PARTITIONS} for p in discover(root)]
