"""Logs larger than memory: one selection read a few shards at a time.

`load_logs` reads every positions row of a selection into one `ReplayLogs` (about 6 KB a position at
W = 10 in RAM). A `LogSource` makes the same selection (simulator.logs.read.select_logs: sequences,
config, widths; no positions row read) and reads its positions shards in groups:

    group    the shards of the same sequences, one per width: `<name>-w<W>.parquet` (collection writes
             one group per prompt, the synthetic logs one per shard of sequences), sized by its
             primary-width shard's row count (Parquet footer)
    chunks(max_positions)     the groups in read order, packed into chunks of at most max_positions
                              rows (a group larger than that is a chunk of its own) -> ReplayLogs of
                              the chunk's sequences, with `source_index` their index in the selection
    sample(max_positions, seed, include)  a replay window: per dataset, groups drawn in a seeded order
                              until the dataset's share of max_positions (its share of the selection's
                              positions) is filled, plus the groups of the prompts in `include` (validate's
                              decoded prompts) -> one ReplayLogs; everything when the selection fits
    groups_of(prompt_ids)     the groups holding these prompts' sequences: by collection's shard name
                              (`<run_key>-<prompt_hash>`), else from the shards' prompt_id column

A sequence's rows must lie in one group (they do in every log DraftGym writes); one that does not is the
coverage check's one-line DataError. Every selected sequence is read exactly once over `chunks`
(checked at the end). Consumers that combine per-sequence results reorder them by `source_index`, so
their figures equal the in-memory path's (simulator.evaluate).
"""
from __future__ import annotations

import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from pipeline.errors import DataError
from pipeline.logs.schema import check_file, prompt_hash, read_table
from simulator.logs.replay_logs import ReplayLogs, assemble
from simulator.logs.read import partition_values, position_files, select_logs

DEFAULT_MAX_POSITIONS = 500_000      # rows per chunk / window: ~3 GB of replay arrays at W = 10 (docs/design.md)
_WIDTH_SUFFIX = re.compile(r"^(.*)-w(\d+)$")


@dataclass
class FileGroup:
    files: list[Path]                # one shard per width (or one shard of every width)
    rows: int                        # rows of the primary width (its shard's footer), or of all rows
    dataset: str
    name: str                        # the shard name without -w<W> (collection: <run_key>-<prompt_hash>)


class LogSource:
    """One selection of logs (the arguments of `load_logs`), read in chunks or as a sampled window."""

    def __init__(self, root, model=None, temperature=None, datasets=None, split=None, width=None, widths=None,
                 dtype=None, progress: bool = True):
        self.sel = select_logs(root, model, temperature, datasets, split, width, widths, dtype)
        self.progress = progress
        self.groups = self._groups()
        short = int((self.sel.sequences.new_tokens <= 1).sum())
        self.notes = [f"{short} sequences with new_tokens <= 1 (nothing to draft) dropped"] if short else []

    @property
    def n_sequences(self) -> int:
        return len(self.sel.sequences.new_tokens)

    @property
    def n_positions(self) -> int:
        """Positions the selection replays: new_tokens - 1 per sequence (sequences shorter than 2 drop)."""
        return int(np.maximum(self.sel.sequences.new_tokens - 1, 0)[self.sel.sequences.new_tokens > 1].sum())

    def _groups(self) -> list[FileGroup]:
        by_key: dict[tuple[Path, str], dict[int, Path]] = {}
        fs = None if self.sel.store is None else self.sel.store.fs
        for f in position_files(self.sel):
            m = _WIDTH_SUFFIX.match(f.stem)
            name, W = (m.group(1), int(m.group(2))) if m else (f.stem, -1)
            by_key.setdefault((f.parent, name), {})[W] = f
        out = []
        for (d, name), files in by_key.items():
            main = files.get(self.sel.width, next(iter(files.values())))
            if len(files) > 1 and self.sel.width not in files:
                continue                                 # a group without the primary width: no selected rows
            ds = partition_values(d).get("dataset", "")
            out.append(FileGroup([files[W] for W in sorted(files)],
                                 check_file(main, "positions", fs).metadata.num_rows, ds, name))
        if not out:
            raise DataError(f"no positions shards for {self.sel.where} under {self.sel.root}/positions")
        return out

    def read(self, groups: list[FileGroup], scores: bool | str = True) -> ReplayLogs:
        """The ReplayLogs of the selected sequences with rows in these groups (scores=False: acceptance
        only, the score arrays [n, Dmax, 0]: for static replay, grid search and the oracle)."""
        return assemble(self.sel.read([f for g in groups for f in g.files], scores), only_present=True)

    def chunks(self, max_positions: int = DEFAULT_MAX_POSITIONS, desc: str = "read logs",
               scores: bool | str = True) -> Iterator[ReplayLogs]:
        """Every selected sequence once, in chunks of at most max_positions rows (module doc)."""
        from tqdm import tqdm

        seen = np.zeros(self.n_sequences, bool)
        total = sum(g.rows for g in self.groups)
        bar = tqdm(total=total, desc=desc, unit="pos", unit_scale=True, disable=not self.progress, mininterval=2)
        for pack in pack_groups(self.groups, max_positions):
            logs = self.read(pack, scores)
            if seen[logs.source_index].any():
                raise DataError(f"sequence {logs.prompt_id[np.flatnonzero(seen[logs.source_index])[0]]} has rows "
                                f"in more than one shard group")
            seen[logs.source_index] = True
            bar.update(sum(g.rows for g in pack))
            yield logs
        bar.close()
        missing = np.flatnonzero(~seen & (self.sel.sequences.new_tokens > 1))
        if len(missing):
            raise DataError(f"sequence {self.sel.sequences.prompt_id[missing[0]]} has no positions rows "
                            f"({len(missing)} selected sequence(s) without rows)")

    def groups_of(self, prompt_ids) -> list[int]:
        """Indices of the groups that hold the selected sequences of these prompts (module doc)."""
        seqs, want = self.sel.sequences, set(prompt_ids)
        names = {f"{rk}-{prompt_hash(p)}" for rk, p in zip(seqs.run_key.tolist(), seqs.prompt_id.tolist()) if p in want}
        hit = [i for i, g in enumerate(self.groups) if g.name in names]
        if len(hit) < len(names):                        # not collection's layout: ask the shards themselves
            fs = None if self.sel.store is None else self.sel.store.fs
            hit = [i for i, g in enumerate(self.groups)
                   if want.intersection(read_table(g.files[0], "positions", ["prompt_id"], fs).column(0).to_pylist())]
        return hit

    def sample(self, max_positions: int = DEFAULT_MAX_POSITIONS, seed: int = 0, include=()) -> ReplayLogs:
        """A replay window of at most ~max_positions rows, plus the groups of the prompts in `include`
        (module doc); the whole selection when it fits."""
        t0 = time.perf_counter()
        total = sum(g.rows for g in self.groups)
        if total <= max_positions:
            picked = self.groups
        else:
            rng, keep = np.random.default_rng(seed), self.groups_of(include) if include else []
            for ds in sorted({g.dataset for g in self.groups}):
                mine = [i for i, g in enumerate(self.groups) if g.dataset == ds]
                budget, used = max_positions * sum(self.groups[i].rows for i in mine) / total, 0
                for i in rng.permutation(mine):
                    if used and used + self.groups[i].rows > budget:
                        break
                    keep.append(i)
                    used += self.groups[i].rows
            picked = [self.groups[i] for i in sorted(set(keep))]
        logs = self.read(picked)        # in the selection's order, as load_logs (assemble orders by source_index)
        logs.notes = list(self.notes)
        if len(picked) < len(self.groups):
            logs.notes.append(f"replay window: {logs.n_positions:,} of {self.n_positions:,} positions "
                              f"(--max-positions-in-memory {max_positions:,}, seed {seed})")
            if self.progress:
                dt = time.perf_counter() - t0
                print(f"{logs.notes[-1]}, read in {dt:.1f} s ({logs.n_positions / max(dt, 1e-9):,.0f} pos/s)",
                      file=sys.stderr)
        return logs


def pack_groups(groups: list[FileGroup], max_positions: int) -> Iterator[list[FileGroup]]:
    """The groups in order, packed into lists of at most max_positions rows (a larger group alone)."""
    pack, rows = [], 0
    for g in groups:
        if pack and rows + g.rows > max_positions:
            yield pack
            pack, rows = [], 0
        pack.append(g)
        rows += g.rows
    if pack:
        yield pack
