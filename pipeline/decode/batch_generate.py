"""Batched autoregressive generation of target continuations (collection and train-draft's
self-distillation), with per-row seeds, per-row EOS, a refill queue and an on-disk cache.

Layout: slots, not left padding. Each of the B slots holds one prompt; its token at position t
sits at index t of the slot's preallocated KV buffer (so positions are the natural ones and no
row is shifted by padding). A decode step feeds one token per slot at its own position n_r and
writes its K/V at index n_r (a scatter into the buffer: no torch.cat, nothing is copied per
step); the attention reads keys [0, span) with span = max_r n_r + 1 and an additive mask

    mask[r, 0, 0, j] = 0 if j <= n_r else finfo.min      # [A, 1, 1, span]

so entries past a slot's own length (padding, or a previous occupant's leftovers) weigh exactly 0.
Why slots over left padding: a finished row's slot is refilled from the queue with a prompt of any
length without moving the other rows, which left padding cannot do (all rows share one right
edge). The first B prompts are prefilled together, right-padded, in length-sorted groups
(`prefill_groups`); a prompt that later refills a freed slot is prefilled at batch 1 with a
DynamicCache, as `Engine.generate_ar` does. Either way its KV is copied once into its slot. When
rows finish and the queue is empty, the buffer is compacted to the live rows once they are at most
half of it (log2 B copies in all, each smaller).

KV cache choice (measured on this CPU, Intel Xeon with AMX, 2 threads, smollm2-135m, batch 16,
16 MT-bench/ShareGPT prompts, 48 new tokens; docs/adhoc/batch_generate_speed.py): this slot cache
124 tok/s against HF `generate` (left padding, DynamicCache, torch.cat per step) 128 tok/s in fp32,
a tie within noise; in bf16, 204 against 146 tok/s (1.4x). HF's
StaticCache is also preallocated but shares one write position (cache_position) across the batch,
so it cannot hold rows of different lengths without left padding, nor refill a slot.

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
from pathlib import Path
from typing import Callable

import torch

from pipeline.errors import DraftGymError
from pipeline.runtime.fingerprint import dtype_name
from pipeline.decode.arch import check_length, logits_are_lm_head
from pipeline.decode.verify import sample_token, target_forward


@dataclass
class Continuation:
    output_ids: list[int]          # the new tokens only (EOS kept when it stopped the row)
    stop_reason: str               # 'eos' | 'max_new_tokens'


class SlotKV:
    """Preallocated K/V for B slots: per layer [B, n_kv, S, d]. Duck-types the one method HF
    attention calls on a cache, `update(k, v, layer_idx)`, for one-token decode steps."""

    def __init__(self, n_layers: int, B: int, n_kv: int, S: int, d: int, dtype, device):
        self.k = [torch.zeros(B, n_kv, S, d, dtype=dtype, device=device) for _ in range(n_layers)]
        self.v = [torch.zeros_like(k) for k in self.k]
        self.pos = torch.zeros(B, dtype=torch.long, device=device)   # [A] write index of this step
        self.span = 1                                                 # keys read: [0, span)

    def update(self, k, v, layer_idx, *args, **kwargs):
        """k, v: [A, n_kv, 1, d] -> write at (row, pos[row]); return keys/values [A, n_kv, span, d]."""
        rows = torch.arange(k.shape[0], device=k.device)
        self.k[layer_idx][rows, :, self.pos] = k[:, :, 0]
        self.v[layer_idx][rows, :, self.pos] = v[:, :, 0]
        return self.k[layer_idx][:, :, : self.span], self.v[layer_idx][:, :, : self.span]

    def load(self, slot: int, cache, n: int, row: int = 0) -> None:
        """Copy row `row`'s first n entries of a DynamicCache into slot `slot`, indices [0, n)."""
        for i, layer in enumerate(cache.layers):
            self.k[i][slot, :, :n] = layer.keys[row, :, :n]
            self.v[i][slot, :, :n] = layer.values[row, :, :n]

    def keep(self, rows: torch.Tensor) -> None:
        """Compact to the given slots (a copy; done only when at most half the slots are live)."""
        self.k = [k[rows] for k in self.k]
        self.v = [v[rows] for v in self.v]


def _kv_geometry(model) -> tuple[int, int, int]:
    c = model.config
    n_heads = c.num_attention_heads
    d = getattr(c, "head_dim", None) or c.hidden_size // n_heads
    return c.num_hidden_layers, getattr(c, "num_key_value_heads", None) or n_heads, d


@torch.inference_mode()
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
    if max_new_tokens < 1:
        raise DraftGymError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if batch_size < 1:
        raise DraftGymError(f"batch_size must be >= 1, got {batch_size}")
    if temperature < 0:
        raise DraftGymError(f"temperature must be >= 0, got {temperature}")
    seeds = [seeds] * len(prompts) if isinstance(seeds, int) else list(seeds)
    if len(seeds) != len(prompts):
        raise DraftGymError(f"{len(seeds)} seeds for {len(prompts)} prompts")
    for p in prompts:
        if len(p) == 0:
            raise DraftGymError("empty prompt: no input tokens")
        check_length(model.config, len(p), max_new_tokens)   # positions, and a sliding window (unmasked here)
    eos = set() if run_past_eos else set(eos_token_ids)
    results: list[Continuation | None] = [None] * len(prompts)
    keys = [None] * len(prompts)

    def finish(i: int, out: list[int], stop: str) -> None:
        results[i] = Continuation(out, stop)
        if cache is not None:
            cache.put(keys[i], results[i])
        if on_result is not None:
            on_result(i, results[i])

    queue = []
    for i, p in enumerate(prompts):
        if cache is not None:
            keys[i] = cache.key(p, temperature, seeds[i], max_new_tokens, run_past_eos, eos_token_ids)
            hit = cache.get(keys[i])
            if hit is not None:
                results[i] = hit
                if on_result is not None:
                    on_result(i, hit)
                continue
        queue.append(i)
    if not queue:
        return results

    dev = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    n_layers, n_kv, d = _kv_geometry(model)
    B = min(batch_size, len(queue))
    S = max(len(prompts[i]) for i in queue) + max_new_tokens
    kv = SlotKV(n_layers, B, n_kv, S, d, dtype, dev)
    slot_prompt: list[int | None] = [None] * B           # prompt index held by each slot
    slot_out: list[list[int]] = [[] for _ in range(B)]
    slot_gen: list[torch.Generator | None] = [None] * B
    queue.reverse()                                       # pop() takes prompts in order

    def stopped(out: list[int]) -> str | None:
        """Engine._finish for one new token: 'eos' | 'max_new_tokens' | None (go on)."""
        if out[-1] in eos:
            return "eos"
        return "max_new_tokens" if len(out) >= max_new_tokens else None

    def more() -> bool:
        """Take another prompt from the queue?"""
        return bool(queue) and not (stop_refill is not None and stop_refill())

    def start(s: int, i: int, last_logits: torch.Tensor) -> bool:
        """Prompt i's first token from its prefill's last logits [vocab]: True if its row goes on in
        slot s, False if that token already finished it."""
        gen = torch.Generator(device=dev).manual_seed(seeds[i])
        out = [sample_token(last_logits, temperature, gen)]
        stop = stopped(out)
        if stop is not None:
            finish(i, out, stop)
            return False
        slot_prompt[s], slot_out[s], slot_gen[s] = i, out, gen
        return True

    def fill(s: int) -> None:
        """Prefill prompts into slot s (batch 1, as generate_ar) until one does not finish at once."""
        slot_prompt[s] = None
        while more():
            i = queue.pop()
            p = prompts[i]
            from transformers import DynamicCache
            c = DynamicCache(config=model.config)
            logits, _ = target_forward(model, torch.tensor([p], device=dev), torch.arange(len(p), device=dev)[None],
                                       c, hidden_states=False, last_only=True)
            if start(s, i, logits[-1]):
                kv.load(s, c, len(p))
                return

    # the first B prompts: prefilled together, right-padded, in groups (one forward per group instead
    # of one per prompt); the slots of rows that stop at once, and later refills, go through fill()
    first = []
    while len(first) < B and more():
        first.append(queue.pop())
    for s, i, logits in prefill_groups(model, prompts, first, kv):
        start(s, i, logits)
    for s in range(B):
        if slot_prompt[s] is None:
            fill(s)
    while any(i is not None for i in slot_prompt):
        # one decode step over the buffer rows: live row r feeds x_{n_r} at position n_r = P_r + len(out_r) - 1;
        # a dead row (finished, queue empty, not yet compacted) feeds token 0 at position 0, output ignored
        live = [i is not None for i in slot_prompt]
        n = torch.tensor([len(prompts[i]) + len(o) - 1 if i is not None else 0
                          for i, o in zip(slot_prompt, slot_out)], device=dev)                        # [A]
        ids = torch.tensor([[o[-1] if i is not None else 0]
                            for i, o in zip(slot_prompt, slot_out)], device=dev)               # [A, 1]
        kv.pos, kv.span = n, int(n.max()) + 1
        allowed = torch.arange(kv.span, device=dev)[None, :] <= n[:, None]                            # [A, span]
        mask = torch.zeros(allowed.shape, dtype=dtype, device=dev).masked_fill_(~allowed, torch.finfo(dtype).min)
        logits = model(input_ids=ids, position_ids=n[:, None], cache=kv, attention_mask=mask[:, None, None],
                       use_cache=True).logits[:, -1].float()                                           # [A, vocab]
        greedy = logits.argmax(-1).tolist() if temperature <= 0 else None
        for s in range(len(slot_prompt)):
            if not live[s]:
                continue
            tok = greedy[s] if greedy is not None else sample_token(logits[s], temperature, slot_gen[s])
            slot_out[s].append(tok)
            stop = stopped(slot_out[s])
            if stop is not None:
                finish(slot_prompt[s], slot_out[s], stop)
                fill(s)
        keep = [s for s, i in enumerate(slot_prompt) if i is not None]
        if keep and 2 * len(keep) <= len(slot_prompt):
            # at most half the rows live: drop the dead ones (one copy of the live rows' KV); before
            # that the dead rows run along, so no step ever copies the cache
            kv.keep(torch.tensor(keep, device=dev))
            slot_prompt = [slot_prompt[s] for s in keep]
            slot_out = [slot_out[s] for s in keep]
            slot_gen = [slot_gen[s] for s in keep]
    return results


PREFILL_TOKENS = 1024   # padded tokens per batched prefill forward (rows x longest prompt of the group)


def length_groups(lengths: list[int], max_items: int, max_tokens: int) -> list[list[int]]:
    """Consecutive groups of indices (lengths sorted ascending) with at most max_items members and
    members x the group's longest length <= max_tokens (a longer single item is a group alone)."""
    groups, cur = [], []
    for i, n in enumerate(lengths):
        if cur and (len(cur) + 1 > max_items or (len(cur) + 1) * n > max_tokens):
            groups.append(cur)
            cur = []
        cur.append(i)
    return groups + ([cur] if cur else [])


def prefill_groups(model, prompts: list[list[int]], order: list[int], kv: SlotKV):
    """Prefill the prompts of indices `order` into slots 0, 1, ... of kv, several per forward: yields
    (slot, prompt index, last-token logits [vocab] fp32) per prompt, shortest prompt first.

    Why: a batch-1 prefill of a short prompt has only P rows per matmul, and the bench's 64 ShareGPT
    prompts of ~77 tokens prefilled one by one took 4.0 s, a third of their generation. A group is
    right-padded to its longest prompt with natural positions: causal attention never lets a row see
    the padding after it, so no mask is needed, and only each row's [0, P) KV entries are copied
    into its slot. Prompts are sorted by length and cut into groups of at most PREFILL_TOKENS padded
    tokens (`length_groups`), so a group's rows have similar lengths. Measured on that bench
    (bf16, 2-core Xeon): 4.0 s one by one; grouped 2.9 / 3.8 / 4.3 s unsorted and 1.9 / 2.0 / 4.9 s
    sorted at 1,024 / 4,096 / 16,384 padded tokens (large groups pad short rows to the longest).

    The logits come from the decoder stack plus the output embedding on each row's last hidden state
    (`pipeline.decode.target.base_model`: the CausalLM's own `logits_to_keep` path copies the lm_head weight
    once per row). Targets whose CausalLM changes logits after the lm_head (Gemma-2's soft-capping,
    Cohere's and Granite's logit scales: `arch.logits_are_lm_head`) are prefilled one by one through
    the CausalLM, as before.
    Exactness: like the batched decode steps, a row's numbers may differ from its batch-1 prefill by
    the rounding of matmuls with more rows; fp32 rows are equal token for token in the tests."""
    from transformers import DynamicCache

    from pipeline.decode.target import base_model

    dev = kv.k[0].device
    cfg = model.config
    plain_head = logits_are_lm_head(cfg)        # no soft-capping / logit scale after the lm_head (pipeline/decode/arch.py)
    order = sorted(order, key=lambda j: len(prompts[j]))
    groups = [[order[k] for k in g] for g in length_groups([len(prompts[i]) for i in order],
                                                           len(order) if plain_head else 1, PREFILL_TOKENS)]
    slot = 0
    for grp in groups:
        Ps = [len(prompts[i]) for i in grp]
        P = max(Ps)
        ids = torch.tensor([prompts[i] + [0] * (P - len(prompts[i])) for i in grp], device=dev)     # [G, P]
        cache = DynamicCache(config=cfg)
        if plain_head:
            h = base_model(model)(input_ids=ids, position_ids=torch.arange(P, device=dev)[None].expand(len(grp), -1),
                                  cache=cache, use_cache=True).last_hidden_state                     # [G, P, H]
            last = h[torch.arange(len(grp), device=dev), torch.tensor(Ps, device=dev) - 1]           # [G, H]
            logits = model.get_output_embeddings()(last).float()                                     # [G, vocab]
        else:
            logits = model(input_ids=ids, position_ids=torch.arange(P, device=dev)[None], cache=cache,
                           use_cache=True, logits_to_keep=1).logits[:, -1].float()                   # G = 1
        for r, i in enumerate(grp):
            kv.load(slot, cache, Ps[r], row=r)
            yield slot, i, logits[r]
            slot += 1


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
