"""Checked reads of collected logs: the sequences and positions rows of one (model, temperature, dtype).

Layout (pipeline/logs/schema.py): <logs>/{sequences,positions}/model=M/dataset=D/temperature=T/*.parquet.
`read_logs` selects the partitions (model, temperature, datasets), then the sequences (dtype, split),
checks that they share one collection config (max_depth, verify grid) and the wanted widths, and reads
the positions rows of those sequences per width, as numpy arrays in file order:

    acc  [n, Dmax, G] uint8     beam [n, Dmax, W] float32     ent [n, Dmax, W] float32
    cand [n, Dmax, W*W] float32 per level sorted best first, floored (version 2), or None and
    tail [n, Dmax, W*W - W] float16 (version 3; pipeline/logs/candidates.py)
    dist [n, Dmax, Dmax+1] float32 or None (not logged)

simulator.logs.replay_logs orders them by (sequence, position), checks the coverage and builds ReplayLogs.
Every file read goes through `pipeline.logs.schema.read_table` (checked): a corrupt, truncated or
foreign file raises a one-line `DataError`; so do missing tables, selections the logs do not hold
and inconsistent configs.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import numpy as np
import pyarrow as pa

from pipeline.errors import DataError
from pipeline.logs.candidates import levels_from_v2
from pipeline.logs.schema import check_file, read_checked, read_table, tail_values
from pipeline.logs.storage import LogStore, is_remote, local_dir, resolve_out


@dataclass
class SequenceColumns:
    """The selected sequences' columns as numpy arrays [S], and (run_key, prompt_id) -> sequence index."""
    run_key: np.ndarray
    prompt_id: np.ndarray
    dataset: np.ndarray
    new_tokens: np.ndarray
    prompt_len: np.ndarray
    key_to_seq: dict

    @classmethod
    def of(cls, seqs: pa.Table) -> "SequenceColumns":
        run_key = np.array(seqs.column("run_key").to_pylist(), dtype=object)
        prompt_id = np.array(seqs.column("prompt_id").to_pylist(), dtype=object)
        keys = list(zip(run_key.tolist(), prompt_id.tolist()))
        if len(set(keys)) != len(keys):
            raise DataError("duplicate (run_key, prompt_id) rows in the sequences table")
        return cls(run_key=run_key, prompt_id=prompt_id,
                   dataset=np.array(seqs.column("dataset").to_pylist(), dtype=object),
                   new_tokens=np.asarray(seqs.column("new_tokens").to_numpy(), np.int64),
                   prompt_len=np.array([len(x) for x in seqs.column("prompt_tokens").to_pylist()], np.int64),
                   key_to_seq={k: i for i, k in enumerate(keys)})

    def take(self, idx: np.ndarray) -> "SequenceColumns":
        """The sequences idx (key_to_seq then maps to positions in idx)."""
        keys = list(zip(self.run_key[idx].tolist(), self.prompt_id[idx].tolist()))
        return SequenceColumns(run_key=self.run_key[idx], prompt_id=self.prompt_id[idx], dataset=self.dataset[idx],
                               new_tokens=self.new_tokens[idx], prompt_len=self.prompt_len[idx],
                               key_to_seq={k: i for i, k in enumerate(keys)})


@dataclass
class LogRows:
    """What `read_logs` returns: the selected sequences and their positions rows, before assembly."""
    model: str
    temperature: float
    dtype: str                           # the target's compute dtype
    max_depth: int                       # Dmax
    verify_grid: np.ndarray              # [G] int64
    width: int                           # the primary W
    sequences: SequenceColumns           # [S] columns of the selected sequences
    splits: np.ndarray                   # [S] object ('none' where unset)
    positions: dict[int, dict[str, list]]   # {W: {"seq", "pos", "ctx", "acc", "beam", "cand", "ent", "dist": [per file]}}


def read_logs(root: str | Path, model: str | None = None, temperature: float | None = None,
              datasets: list[str] | str | None = None, split: str | list[str] | None = None,
              width: int | None = None, widths: list[int] | None = None, dtype: str | None = None) -> LogRows:
    """The checked rows of one (model, temperature, dtype) for the given datasets, split(s), width(s)
    (the arguments of simulator.logs.replay_logs.load_logs)."""
    sel = select_logs(root, model, temperature, datasets, split, width, widths, dtype)
    return sel.read(position_files(sel))


@dataclass
class LogSelection:
    """Everything `read_logs` decides before reading a positions row: the partitions, the selected
    sequences, the collection config and the widths. `read(files)` reads those files' rows of the
    selected sequences (simulator.logs.stream reads a selection a few files at a time)."""
    root: Path
    parts: list[dict]
    model: str
    temperature: float
    dtype: str
    max_depth: int
    verify_grid: np.ndarray
    width: int
    widths: list[int]
    sequences: SequenceColumns
    splits: np.ndarray
    store: LogStore | None = None        # an object store: positions shards are read from it, not mirrored

    @property
    def where(self) -> str:
        return f"model={self.model} temperature={self.temperature:g}"

    def read(self, files: list[Path], scores: bool | str = True) -> LogRows:
        """These files' rows (scores=False: acceptance only; NO_CANDIDATES: all but the candidates;
        see _read_positions)."""
        if not files:
            raise DataError(f"no positions shards for {self.where} under {self.root}/positions")
        rows = _read_positions(files, self.widths, self.sequences.key_to_seq, self.max_depth, len(self.verify_grid),
                               scores, None if self.store is None else self.store.fs)
        return LogRows(model=self.model, temperature=self.temperature, dtype=self.dtype, max_depth=self.max_depth,
                       verify_grid=self.verify_grid, width=self.width, sequences=self.sequences, splits=self.splits,
                       positions=rows)


def select_logs(root: str | Path, model: str | None = None, temperature: float | None = None,
                datasets: list[str] | str | None = None, split: str | list[str] | None = None,
                width: int | None = None, widths: list[int] | None = None, dtype: str | None = None) -> LogSelection:
    """The checked selection of `read_logs` (sequences and config), no positions rows read yet. An
    object-store root (s3://, gs://): its sequences table is mirrored locally, its positions shards are
    read from the store when `read` reads them (so a chunk or a Ray task fetches only its own shards)."""
    store = resolve_out(root) if is_remote(root) else None
    root = local_dir(root, "the simulator", tables=("sequences",))
    parts, model, temperature = _select_partitions(root, model, temperature, datasets)
    where = f"model={model} temperature={temperature:g}"
    seqs = _read_sequences(parts, where, root)
    seqs, splits, dtype = _select_sequences(seqs, dtype, split, where, root)
    max_depth, grid = _collection_config(seqs)
    width, want = _pick_widths(seqs, width, widths)
    return LogSelection(root=Path(root), parts=parts, model=model, temperature=float(temperature), dtype=dtype,
                        max_depth=max_depth, verify_grid=grid, width=width, widths=want,
                        sequences=SequenceColumns.of(seqs), splits=splits, store=store)


def position_files(sel: LogSelection) -> list:
    """The positions shards of the selection's partitions, in read order (temp files excluded): local
    Paths, or with an object store the shards' paths on it (PurePosixPath)."""
    out = []
    for p in sel.parts:
        rel = p["dir"].relative_to(sel.root / "sequences")
        if sel.store is not None:
            d = sel.store.path("positions", rel.as_posix())
            out += [PurePosixPath(d) / n for n in sel.store.list_files(d, ".parquet") if not n.startswith(".")]
            continue
        d = sel.root / "positions" / rel
        out += sorted(x for x in d.glob("*.parquet") if not x.name.startswith(".")) if d.is_dir() else []
    return out


# -- the steps of read_logs ---------------------------------------------------------------------

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


def _pick(name: str, wanted, available: list, match=lambda w, a: w == a):
    if wanted is None:
        if len(available) != 1:
            raise DataError(f"several {name}s in the logs ({', '.join(map(str, available))}); choose one")
        return available[0]
    for a in available:
        if match(wanted, a):
            return a
    raise DataError(f"{name} {wanted!r} not in the logs (have {', '.join(map(str, available))})")


def _select_partitions(root: Path, model, temperature, datasets) -> tuple[list[dict], str, float]:
    """The sequences partitions of one model and temperature (each may be omitted when the logs hold
    one) and the wanted datasets (a list or a comma-separated string; None: all)."""
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
    return parts, model, temperature


def _read_sequences(parts: list[dict], where: str, root: Path) -> pa.Table:
    """The sequences rows of these partitions, with their dataset as a column."""
    tables = []
    for p in parts:
        for f in sorted(x for x in p["dir"].glob("*.parquet") if not x.name.startswith(".")):
            t = read_table(f, "sequences", columns=["run_key", "prompt_id", "split", "model_id", "dtype", "prompt_tokens",
                                                   "new_tokens", "widths", "max_depth", "verify_grid"])
            tables.append(t.append_column("dataset", pa.array([p["dataset"]] * len(t), pa.string())))
    seqs = pa.concat_tables(tables) if tables else None
    if seqs is None or len(seqs) == 0:
        raise DataError(f"no sequences for {where} under {root}")
    return seqs


def _select_sequences(seqs: pa.Table, dtype, split, where: str, root: Path) -> tuple[pa.Table, np.ndarray, str]:
    """Keep one dtype (may be omitted when the logs hold one) and the wanted split(s).
    Returns (sequences, their splits ('none' where unset), the dtype)."""
    dtypes = np.array(seqs.column("dtype").to_pylist(), dtype=object)
    have_dt = sorted(set(dtypes.tolist()))
    if dtype is None:
        if len(have_dt) > 1:
            raise DataError(f"the logs for {where} hold several dtypes ({', '.join(have_dt)}); choose one with --dtype")
        dtype = have_dt[0]
    elif dtype not in have_dt:
        raise DataError(f"no {dtype} logs for {where} under {root} (have {', '.join(have_dt)})")
    splits = np.array(seqs.column("split").to_pylist(), dtype=object)
    splits = np.where(splits == None, "none", splits)  # noqa: E711
    keep = dtypes == dtype
    if split not in (None, "all"):
        keep &= np.isin(splits, [split] if isinstance(split, str) else list(split))
    if not keep.any():
        raise DataError(f"no sequences in split {split!r} (splits present: {sorted(set(splits.tolist()))})")
    idx = np.flatnonzero(keep)
    return seqs.take(pa.array(idx)), splits[idx], dtype


def _collection_config(seqs: pa.Table) -> tuple[int, np.ndarray]:
    """(max_depth, verify grid) the selected sequences were collected with: one of each."""
    max_depths = set(seqs.column("max_depth").to_pylist())
    grids = {tuple(g) for g in seqs.column("verify_grid").to_pylist()}
    if len(max_depths) != 1 or len(grids) != 1:
        raise DataError(f"the selected sequences mix collection configs (max_depth {sorted(max_depths)}, "
                        f"{len(grids)} verify grids); select one run")
    return int(max_depths.pop()), np.array(grids.pop(), np.int64)


def _pick_widths(seqs: pa.Table, width, widths) -> tuple[int, list[int]]:
    """(the primary width, every width to load), all logged for every selected sequence."""
    common = sorted(set.intersection(*[set(w) for w in seqs.column("widths").to_pylist()]))
    if not common:
        raise DataError("the selected sequences share no logged width")
    if width is None:
        width = 10 if 10 in common else common[0]
    if width not in common:
        raise DataError(f"width {width} not logged for every selected sequence (common widths: {common})")
    if widths == "all":
        return width, common
    want = sorted({width, *(widths or [])})
    bad = [x for x in want if x not in common]
    if bad:
        raise DataError(f"width(s) {bad} not logged for every selected sequence (common widths: {common})")
    return width, want


_POSITION_COLUMNS = {"run_key", "prompt_id", "position", "context_len", "width", "acceptance", "beam_scores", "entropy"}
_CANDIDATES = ("candidate_tail", "candidate_scores")     # version 3, version 2 (pipeline/logs/candidates.py)


_ACCEPTANCE_ONLY = ["run_key", "prompt_id", "position", "context_len", "width", "acceptance"]
NO_CANDIDATES = "no-candidates"     # scores= value: beams and entropy, not the candidates (heuristic replay)


def _read_positions(files: list[Path], want: list[int], key_to_seq: dict, Dm: int, G: int,
                    scores: bool | str = True, fs=None) -> dict[int, dict[str, list]]:
    """The rows of the selected sequences in these positions files, per width: {W: {"seq", "pos", "ctx",
    "acc", "beam", "cand", "ent", "dist": [one array per file]}}, in file order. scores=False reads
    acceptance only (static replay, grid search, the oracle): the score arrays are [n, Dmax, 0].
    scores=NO_CANDIDATES reads all but the candidates (WidthArrays.candidate_scores then raises)."""
    rows: dict[int, dict[str, list]] = {W: {k: [] for k in ("seq", "pos", "ctx", "acc", "beam", "cand", "tail",
                                                                "ent", "dist")} for W in want}
    for f in files:
        pf = check_file(f, "positions", fs)
        names = pf.schema_arrow.names                                    # the shard's columns, read or not
        if not _POSITION_COLUMNS <= set(names):
            raise DataError(f"{f}: positions file lacks columns {sorted(_POSITION_COLUMNS - set(names))}")
        columns = None if scores is True else [n for n in names if n not in _CANDIDATES] if scores else \
            _ACCEPTANCE_ONLY
        t = read_checked(pf, f, columns)
        wcol = np.asarray(t.column("width").to_numpy(), np.int64)
        if not set(names) & set(_CANDIDATES) and len(wcol) and not (wcol == 1).all():   # W = 1: no tail
            raise DataError(f"{f}: positions file lacks columns ['candidate_tail']")
        for W in want:
            m = wcol == W
            if m.any():
                _add_width_rows(rows[W], t if m.all() else t.filter(pa.array(m)), W, key_to_seq, Dm, G, f,
                                "accept_dist" in t.column_names)
    return rows


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


def _scores(tw: pa.Table, W: int, Dm: int, has_dist: bool):
    """beam [n, Dm, W]; the candidates as (sorted levels [n, Dm, W*W] float32, None) from version 2, or as
    (None, tail [n, Dm, W*W - W] float16) from version 3 (load.WidthArrays builds the levels when read);
    entropy [n, Dm, W]; accept_dist or None."""
    beam = _fixed_list(tw.column("beam_scores"), (Dm, W), np.float32)
    cand, tail = None, None
    if "candidate_tail" in tw.column_names:
        tail = tail_values(tw.column("candidate_tail"), (Dm, W * W - W)).copy()     # off the Arrow buffer
    elif "candidate_scores" in tw.column_names:
        cand = levels_from_v2(_fixed_list(tw.column("candidate_scores"), (Dm, W * W), np.float32))
    elif W == 1:                                                        # no candidate below the beam
        tail = np.zeros((len(tw), Dm, 0), np.float16)
    # else: not read (NO_CANDIDATES): cand and tail stay None
    ent = _fixed_list(tw.column("entropy"), (Dm, W), np.float32)
    dist = _fixed_list(tw.column("accept_dist"), (Dm, Dm + 1), np.float32) if has_dist else None
    return beam, cand, tail, ent, dist


def _add_width_rows(a: dict[str, list], tw: pa.Table, W: int, key_to_seq: dict, Dm: int, G: int, f: Path,
                    has_dist: bool) -> None:
    """Append one file's width-W rows of the selected sequences to `a` (rows of other sequences skipped)."""
    rk, pid = tw.column("run_key").to_pylist(), tw.column("prompt_id").to_pylist()
    sidx = np.array([key_to_seq.get(k, -1) for k in zip(rk, pid)], np.int64)
    sel = sidx >= 0
    if not sel.any():
        return
    if not sel.all():
        tw, sidx = tw.filter(pa.array(sel)), sidx[sel]
    try:
        acc = _fixed_list(tw.column("acceptance"), (Dm, G), np.uint8)
        if "beam_scores" in tw.column_names:
            beam, cand, tail, ent, dist = _scores(tw, W, Dm, has_dist)
        else:                                                           # acceptance only (scores=False)
            beam = cand = ent = np.zeros((len(tw), Dm, 0), np.float32)
            tail, dist = None, None
    except ValueError as e:
        raise DataError(f"{f}: list sizes do not match max_depth={Dm}, W={W}, grid={G} ({e})") from None
    a["seq"].append(sidx)
    a["pos"].append(np.asarray(tw.column("position").to_numpy(), np.int64))
    a["ctx"].append(np.asarray(tw.column("context_len").to_numpy(), np.int64))
    a["acc"].append(acc); a["beam"].append(beam); a["cand"].append(cand); a["tail"].append(tail)
    a["ent"].append(ent); a["dist"].append(dist)
