"""The head trainer's data: which train-split prompts, the target's own answers to them
(self-distillation, batched and resumable), optional reference-answer sequences, and the frozen
dataset (one Parquet of token ids) that a run trains on and that its checkpoints are tied to.

GSM8K's splits are cut from its test file (pipeline/datasets.py): a head trained on gsm8k train has
seen those test questions, never its val or test ones."""
from __future__ import annotations

import copy
import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

import numpy as np
import torch

from pipeline.errors import DraftGymError, first_line
from pipeline.runtime.atomic import atomic_write
from pipeline.train_head.config import TrainConfig, _hash, _log, _slug


@dataclass
class TrainSequence:
    """One training sequence: prompt + answer token ids; positions >= prompt_len are the answer."""

    ids: list[int]
    prompt_len: int
    source: str = ""


def parse_dataset_spec(spec) -> list[tuple[str, int | None]]:
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    out = []
    for it in items:
        it = it.strip()
        if not it:
            continue
        name, _, cnt = it.partition(":")
        try:
            out.append((name, int(cnt) if cnt else None))
        except ValueError:
            raise DraftGymError(f"bad dataset spec {it!r}: use NAME or NAME:COUNT") from None
    if not out:
        raise DraftGymError("no dataset given")
    return out


def allocate(n_total: int, sizes: dict[str, int], fixed: dict[str, int]) -> dict[str, int]:
    """Split n_total over datasets: fixed counts first, the rest evenly, capped by what each has
    (water-filling: a small dataset's unused share goes to the others)."""
    alloc = {k: min(v, sizes[k]) for k, v in fixed.items()}
    free = sorted((k for k in sizes if k not in fixed), key=lambda k: sizes[k])
    left = max(0, n_total - sum(alloc.values()))
    for j, k in enumerate(free):                     # smallest first: each takes an even share of what is left
        alloc[k] = min(sizes[k], left // (len(free) - j))
        left -= alloc[k]
    for k in reversed(free):                         # the integer-division remainder
        extra = min(left, sizes[k] - alloc[k])
        alloc[k] += extra
        left -= extra
    return alloc


def select_prompts(cfg: TrainConfig, tokenizer, split: str = "train", n_total: int | None = None) -> tuple[list[dict], dict]:
    """Prompts of `split` (train; val for the held-out set), shuffled with the seed, tokenized with the
    chat template; prompts over max_prompt_tokens are skipped. n_total: default cfg.n_prompts.
    Returns ([{prompt_id, dataset, prompt_ids}], counts)."""
    from pipeline.datasets import load_prompts

    spec = parse_dataset_spec(cfg.datasets)
    pools = {}
    for name, _ in spec:
        recs = load_prompts(name, split=split)
        order = np.random.default_rng([cfg.seed, int(_hash(name)[:8], 16)]).permutation(len(recs))
        pools[name] = [recs[i] for i in order]
    fixed = {n: c for n, c in spec if c is not None} if split == "train" else {}   # NAME:COUNT: train shares
    alloc = allocate(cfg.n_prompts if n_total is None else n_total, {n: len(p) for n, p in pools.items()}, fixed)
    chosen, counts = [], {}
    for name, recs in pools.items():
        got = [{"prompt_id": r.prompt_id, "dataset": name, "prompt_ids": ids}
               for r, ids in islice(_encoded(recs, tokenizer, cfg.max_prompt_tokens), alloc[name])]
        chosen += got
        counts[name] = len(got)
    return chosen, counts


def _encoded(recs, tokenizer, max_prompt_tokens: int):
    """(record, prompt ids) of the records whose prompt encodes within max_prompt_tokens, in order
    (lazily: a caller taking n of them encodes no more than it needs)."""
    from pipeline.models.target import encode_prompt

    for r in recs:
        try:
            yield r, encode_prompt(tokenizer, list(r.messages), max_prompt_tokens=max_prompt_tokens)
        except DraftGymError:
            continue


def _read_jsonl_tolerant(path: Path) -> dict[str, dict]:
    done = {}
    if not path.is_file():
        return done
    with open(path, "r", encoding="utf-8") as f:
        for line in f:
            try:
                row = json.loads(line)
                done[row["prompt_id"]] = row
            except (json.JSONDecodeError, KeyError):
                continue  # a torn last line from a killed run
    return done


@torch.no_grad()
def regenerate(target, prompts: list[dict], cfg: TrainConfig, path: Path, progress_bar: bool = True) -> list[dict]:
    """Greedy answers from the target for every prompt, appended to JSONL `path` (resumable)."""
    from tqdm import tqdm
    from transformers.utils import logging as hf_logging

    from pipeline.decode.continuations import generate_batch
    from pipeline.models.target import resolve_dtype

    done = _read_jsonl_tolerant(path)
    todo = [p for p in prompts if p["prompt_id"] not in done]
    # length-sorted within random chunks of 8 batches: little padding, and a budget cut drops random prompts
    order = np.random.default_rng(cfg.seed).permutation(len(todo))
    todo = [todo[i] for i in order]
    span = cfg.gen_batch_size * 8
    todo = [p for c in range(0, len(todo), span) for p in sorted(todo[c:c + span], key=lambda p: len(p["prompt_ids"]))]
    if todo and cfg.regen_budget_min is not None and cfg.regen_budget_min <= 0:
        _log(f"regeneration budget 0: training on the {len(done)} cached answers, {len(todo)} prompts skipped")
        todo = []
    if todo:
        _log(f"regenerating {len(todo)} answers ({len(done)} cached) -> {path}")
        dev = target.device
        gdtype = resolve_dtype(cfg.gen_dtype, dev)
        model = target.model
        if next(model.parameters()).dtype != gdtype:
            model = copy.deepcopy(model).to(gdtype)
        if dev.type == "cpu" and hasattr(model, "set_attn_implementation"):
            if model is target.model:
                model = copy.deepcopy(model)
            # one-token decode steps: eager attention is ~2x faster than the CPU flash kernel in bf16
            model.set_attn_implementation("eager")
        eos = sorted(target.eos_token_ids)
        old = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()
        bar = tqdm(total=len(todo), desc="regenerate", disable=not progress_bar, dynamic_ncols=True, file=sys.stderr)
        t0, n_tok, n_done, spent = time.time(), [0], [0], [False]

        def budget_spent() -> bool:      # stops taking prompts from the queue; the rows in flight finish
            if cfg.regen_budget_min is not None and time.time() - t0 >= cfg.regen_budget_min * 60:
                spent[0] = True
            return spent[0]

        try:
            torn = False
            if path.is_file() and path.stat().st_size > 0:
                with open(path, "rb") as f:
                    f.seek(-1, os.SEEK_END)
                    torn = f.read(1) != b"\n"
            with open(path, "a", encoding="utf-8") as f:
                if torn:                            # a killed run left half a line: start on a fresh one
                    f.write("\n")

                def write(i: int, cont) -> None:    # as each row finishes: append, flush (fsync once per batch)
                    p = todo[i]
                    row = {"prompt_id": p["prompt_id"], "dataset": p["dataset"], "prompt_ids": p["prompt_ids"],
                           "response_ids": cont.output_ids, "stop": cont.stop_reason}
                    f.write(json.dumps(row) + "\n")
                    f.flush()
                    done[p["prompt_id"]] = row
                    n_tok[0] += len(cont.output_ids)
                    n_done[0] += 1
                    bar.update(1)
                    if n_done[0] % cfg.gen_batch_size == 0:
                        os.fsync(f.fileno())
                        rate = n_tok[0] / max(time.time() - t0, 1e-9)
                        bar.set_postfix_str(f"{rate:.0f} tok/s")
                        if (n_done[0] // cfg.gen_batch_size) % 5 == 1:
                            _log(f"regenerated {n_done[0]}/{len(todo)} ({n_tok[0]} tokens, {rate:.0f} tok/s)")

                # batched greedy decoding, cut after the first EOS (pipeline/decode/continuations.py): a finished
                # row's slot is refilled from the queue at once, so no row waits for the longest answer
                generate_batch(model, [p["prompt_ids"] for p in todo], cfg.max_new_tokens, 0.0, 0, eos,
                               batch_size=cfg.gen_batch_size, on_result=write, stop_refill=budget_spent)
                f.flush()
                os.fsync(f.fileno())
            if spent[0]:
                _log(f"regeneration budget ({cfg.regen_budget_min} min) spent: {len(done)} answers, "
                     f"{len(todo) - n_done[0]} prompts left for a later run")
        finally:
            hf_logging.set_verbosity(old)
            bar.close()
        del model
    return [done[p["prompt_id"]] for p in prompts if p["prompt_id"] in done]


def select_reference_sequences(cfg: TrainConfig, tokenizer, exclude: set[str], eos_id: int | None) -> list[TrainSequence]:
    """`reference_prompts` train-split prompts (not in `exclude`) with their dataset reference answer
    as the answer text: cheap extra data (no generation; only the teacher-forced target forward),
    labelled, like everything else, with the target's own distributions (EAGLE's original recipe).
    Answers are cut at max_new_tokens (an uncut answer ends with eos)."""
    from pipeline.datasets import load_prompts

    names = [n for n in cfg.reference_datasets if n]
    pools = []
    for name in names:
        recs = [r for r in load_prompts(name, split="train") if r.reference and r.prompt_id not in exclude]
        order = np.random.default_rng([cfg.seed, 7, int(_hash(name)[:8], 16)]).permutation(len(recs))
        pools.append([recs[i] for i in order])
    want = allocate(cfg.reference_prompts, {n: len(p) for n, p in zip(names, pools)}, {})
    out = []
    for name, recs in zip(names, pools):
        pairs = ((r, p_ids, tokenizer(r.reference.strip(), add_special_tokens=False)["input_ids"])
                 for r, p_ids in _encoded(recs, tokenizer, cfg.max_prompt_tokens))
        for r, p_ids, a_ids in islice(((r, p, a) for r, p, a in pairs if a), want[name]):   # non-empty answers
            a_ids = a_ids[: cfg.max_new_tokens] if len(a_ids) >= cfg.max_new_tokens or eos_id is None \
                else a_ids + [eos_id]
            out.append(TrainSequence(p_ids + a_ids, len(p_ids), "ref:" + r.prompt_id))
    return out


DATASET_SCHEMA_VERSION = 1


def freeze_sequences(seqs: list[TrainSequence], path: Path, info: dict) -> dict:
    """Write the training sequences to one Parquet file (columns source, prompt_len, ids: list<int32>;
    the data info in the file's metadata), atomically. Returns {path, sha256 (of the file's bytes),
    sequences, tokens}. (Checkpoints are tied to the hash of the sequences a run trains on, after its
    max_len cut: pipeline.train_head.loop.train_head.)"""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"source": [s.source for s in seqs], "prompt_len": pa.array([s.prompt_len for s in seqs], pa.int32()),
                      "ids": pa.array([s.ids for s in seqs], pa.list_(pa.int32()))})
    table = table.replace_schema_metadata({"draftgym_train_dataset": json.dumps(
        {"version": DATASET_SCHEMA_VERSION, "info": info})})
    atomic_write(path, lambda f: pq.write_table(table, f, compression="zstd"))
    return {"path": str(path), "sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "sequences": len(seqs),
            "tokens": int(sum(len(s.ids) for s in seqs))}


def load_frozen(path: str | Path) -> tuple[list[TrainSequence], dict]:
    """A dataset written by freeze_sequences -> (sequences, its info), with one-line errors."""
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.is_file():
        raise DraftGymError(f"--data {path}: no such file")
    try:
        t = pq.read_table(path)
        meta = json.loads((t.schema.metadata or {}).get(b"draftgym_train_dataset", b"null"))
    except Exception as e:
        raise DraftGymError(f"--data {path}: not a readable Parquet file ({first_line(e)})") from None
    if not meta or meta.get("version") != DATASET_SCHEMA_VERSION or \
            set(t.column_names) != {"source", "prompt_len", "ids"}:
        raise DraftGymError(f"--data {path}: not a DraftGym training dataset (version {DATASET_SCHEMA_VERSION})")
    seqs = [TrainSequence(list(ids), int(pl), src) for src, pl, ids in
            zip(t["source"].to_pylist(), t["prompt_len"].to_pylist(), t["ids"].to_pylist())]
    return seqs, meta["info"]


def default_work_dir(model: str) -> Path:
    from pipeline.runtime.cache import cache_dir
    return cache_dir() / "train-draft" / _slug(model)
