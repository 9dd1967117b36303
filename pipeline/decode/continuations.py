"""Batched autoregressive generation of target continuations (collection and train-draft's
self-distillation), with per-row seeds, per-row EOS, a refill queue and an on-disk cache.

`generate_batch` runs on the one engine (pipeline/decode/engine/core.py, `BatchEngine.generate_ar`):
the slot stores, the first rows prefilled several per forward, continuous batching (a finished row's
slot takes the next prompt at once), and on a GPU the AR step as a CUDA graph, so `draftgym collect`
gets the speed of online decoding. One engine per target is kept (`ar_engine`); its
stores and graphs are released at the end of each call (collection needs the memory in between).

Exactness: row r's token sequence is what batch-1 `Engine.generate_ar` gives with the same seed,
up to fp rounding of the batched decode matmuls (masked keys add exact zeros to the softmax; the
matmul with B rows may sum in another order than with 1 row). Greedy rows are therefore equal to
batch-1 generation unless two logits tie within rounding (pipeline.decode.lossless.classify semantics).
Measured on smollm2-135m: fp32 rows equal at batch 1, 4, 16 and 64 (4 prompts x 48 tokens); in bf16
they part at near-ties, as every reduced-precision batched forward does (docs/design.md,
"Lossless in reduced precision").
Sampling: row r draws from its own torch.Generator seeded with seeds[r], one draw per token as in
generate_ar, so a row's output never depends on its batch-mates.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from typing import Callable
from pathlib import Path

import torch

from pipeline.runtime.fingerprint import dtype_name


@dataclass
class Continuation:
    output_ids: list[int]          # the new tokens only (EOS kept when it stopped the row)
    stop_reason: str               # 'eos' | 'max_new_tokens'


def ar_engine(model):
    """The batched engine generate_batch runs on for this target: one per target, kept on the module
    itself (so it goes when the target goes)."""
    from pipeline.decode.engine.core import BatchEngine

    eng = getattr(model, "_draftgym_ar_engine", None)
    if eng is None:
        eng = BatchEngine(model, None)
        object.__setattr__(model, "_draftgym_ar_engine", eng)
    return eng


def generate_batch(model, prompts: list[list[int]], max_new_tokens: int, temperature: float = 0.0,
                   seeds: int | list[int] = 0, eos_token_ids=(), run_past_eos: bool = False, batch_size: int = 16,
                   cache: "ContinuationCache | None" = None,
                   on_result: Callable[[int, Continuation], None] | None = None,
                   stop_refill: Callable[[], bool] | None = None) -> list[Continuation | None]:
    """Continuations of every prompt, B = batch_size rows at a time, refilled from the queue.

    seeds: one int for all rows or one per prompt (row r samples with Generator(seeds[r])).
    run_past_eos: generate exactly max_new_tokens tokens whatever they are (the caller cuts).
    cache: a ContinuationCache; hits skip generation, misses are appended as they finish.
    on_result(i, cont) is called as prompt i finishes; stop_refill() -> True stops taking prompts from
    the queue (the rows in flight finish), and prompts never started come back as None."""
    from pipeline.decode.engine.rows import check_call

    seeds, _, _ = check_call(model.config, prompts, max_new_tokens, temperature, seeds, batch_size, 0)   # before any hit
    results: list[Continuation | None] = [None] * len(prompts)
    keys = [None] * len(prompts)

    def finish(i: int, cont: Continuation) -> None:
        results[i] = cont
        if cache is not None and keys[i] is not None:
            cache.put(keys[i], cont)
        if on_result is not None:
            on_result(i, cont)

    queue = []
    for i, p in enumerate(prompts):
        if cache is not None:
            keys[i] = cache.key(p, temperature, seeds[i], max_new_tokens, run_past_eos, eos_token_ids)
            hit = cache.get(keys[i])
            if hit is not None:
                keys[i] = None                  # not written again
                finish(i, hit)
                continue
        queue.append(i)
    if not queue:
        return results
    eng = ar_engine(model)
    try:
        eng.generate_ar([prompts[i] for i in queue], max_new_tokens, temperature, [seeds[i] for i in queue],
                        batch_size, eos_token_ids=set() if run_past_eos else set(eos_token_ids), stop_refill=stop_refill,
                        on_result=lambda j, row: finish(queue[j], Continuation(list(row.output_ids), row.stop_reason)))
    finally:
        # the stores (B x the longest sequence of KV: tens of GB for an 8B target at B = 64) are not held
        # between calls, as collection teacher-forces and expands in between; a call's graphs go with them
        eng.release()
    return results


class ContinuationCache:
    """Continuations on disk, keyed by sha1(model id, dtype, sha1 of the prompt ids, T, seed,
    max_new_tokens, run_past_eos, EOS ids): the same key gives the same tokens whatever head or
    width a collection uses, so they are reused across them.

    One JSONL file per (model, dtype) under `$DRAFTGYM_CACHE/continuations/`. Each entry is one
    line, appended with a single write and flushed; a line torn by a killed process is skipped on
    read, and the next append starts on a fresh line."""

    def __init__(self, model_id: str, dtype: str | torch.dtype, root: Path | None = None):
        from pipeline.runtime.cache import cache_dir

        self.model_id, self.dtype = str(model_id), dtype_name(dtype)
        slug = re.sub(r"[^A-Za-z0-9._-]+", "_", self.model_id)[-40:]
        tag = hashlib.sha1(self.model_id.encode()).hexdigest()[:8]
        self.path = Path(root or cache_dir() / "continuations") / f"{slug}-{tag}-{self.dtype}.jsonl"
        self._rows: dict[str, Continuation] | None = None

    def key(self, prompt_ids, temperature: float, seed: int, max_new_tokens: int, run_past_eos: bool, eos=()) -> str:
        prompt_hash = hashlib.sha1(json.dumps([int(t) for t in prompt_ids]).encode()).hexdigest()
        blob = json.dumps([self.model_id, self.dtype, prompt_hash, float(temperature), int(seed), int(max_new_tokens),
                           bool(run_past_eos), sorted(int(t) for t in eos)])
        return hashlib.sha1(blob.encode()).hexdigest()

    def _load(self) -> dict[str, Continuation]:
        if self._rows is None:
            self._rows = {}
            if self.path.is_file():
                with open(self.path, encoding="utf-8") as f:
                    for line in f:
                        try:
                            r = json.loads(line)
                            self._rows[r["key"]] = Continuation(list(r["output_ids"]), r["stop_reason"])
                        except (json.JSONDecodeError, KeyError, TypeError):
                            continue              # a torn last line
        return self._rows

    def get(self, key: str) -> Continuation | None:
        return self._load().get(key)

    def put(self, key: str, cont: Continuation) -> None:
        self._load()[key] = cont
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps({"key": key, "output_ids": cont.output_ids, "stop_reason": cont.stop_reason}) + "\n"
        with open(self.path, "a+b") as f:         # O_APPEND: concurrent writers each append whole lines
            if f.tell() > 0:
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":
                    line = "\n" + line            # the previous writer died mid-line
            f.write(line.encode())
            f.flush()
