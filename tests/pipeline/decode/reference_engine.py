"""The batch-1 EAGLE-3 cycle as the engine ran it until 2026-11-27, kept as the tests' oracle.

`Engine` (pipeline/decode/engine/single.py) now runs every generation on the batched engine at B = 1
(one engine). This is the loop it replaced, on a growing DynamicCache, one token list,
the cycle of docs/design.md read top to bottom, untimed:

    draft : head over the pending entries (f_t, x_{t+1}), t < n  -> root's W children, then up to
            D - 1 more forwards over the W beams                  -> pool
    select: root + the V - 1 best pool nodes                      -> tree, mask, positions
    verify: one target forward over the V tree tokens             -> logits, hidden states
    accept: greedy or EAGLE's q = 1 rule                          -> path (L nodes), bonus
    commit: compact the accepted path's KV, fuse its features (the next pending entries)

tests/pipeline/decode/engine/test_one_engine.py checks that `Engine` gives what this gives, cycle for cycle (fp32: tokens,
D, W, V, L, emitted, context; T > 0 with seeds), so the switch changed no output.
"""
from __future__ import annotations

import torch
from transformers import DynamicCache

from pipeline.decode.engine.result import cut
from pipeline.decode.controller import Controller, CycleRecord, StaticController, StepContext, StepRecord
from pipeline.decode.draft import expand_tree
from pipeline.decode.engine.single import GenerationResult
from pipeline.decode.tree import select_tree
from pipeline.decode.verify import (accept_greedy, accept_sampling, compact_cache, sample_token, target_forward,
                                    verify_tree)


class DraftKV:
    """The head's KV cache of accepted entries (batch 1). keys/values: [1, n_kv, S, d]."""

    def __init__(self):
        self.kv: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def length(self) -> int:
        return 0 if self.kv is None else self.kv[0].shape[2]

    def append(self, new_kv: tuple[torch.Tensor, torch.Tensor]) -> None:
        if self.kv is None:
            self.kv = new_kv
        else:
            self.kv = (torch.cat([self.kv[0], new_kv[0]], 2), torch.cat([self.kv[1], new_kv[1]], 2))



class ReferenceEngine:
    """generate / generate_ar with `Engine`'s signatures and results (times left at 0)."""

    def __init__(self, model, head, eos_token_ids=()):
        self.model, self.head, self.eos = model, head, set(eos_token_ids or ())
        self.device = next(model.parameters()).device

    def _finish(self, out: list[int], max_new: int):
        return cut(out, self.eos, max_new)

    def _prefill(self, prompt: list[int], temperature: float, gen, hidden: bool):
        cache, n = DynamicCache(config=self.model.config), len(prompt)
        logits, hs = target_forward(self.model, torch.tensor([prompt], device=self.device),
                                    torch.arange(n, device=self.device)[None], cache, hidden_states=hidden,
                                    last_only=True)
        return cache, hs, [sample_token(logits[-1], temperature, gen)]

    @torch.inference_mode()
    def generate_ar(self, prompt, max_new_tokens=128, temperature=0.0, seed=0) -> GenerationResult:
        gen = torch.Generator(device=self.device).manual_seed(seed)
        cache, _, out = self._prefill(prompt, temperature, gen, hidden=False)
        out, stop = self._finish(out, max_new_tokens)
        while stop is None:
            n = len(prompt) + len(out) - 1
            logits, _ = target_forward(self.model, torch.tensor([[out[-1]]], device=self.device),
                                       torch.tensor([[n]], device=self.device), cache, hidden_states=False)
            out, stop = self._finish(out + [sample_token(logits[-1], temperature, gen)], max_new_tokens)
        return GenerationResult("ar", list(prompt), out, stop_reason=stop)

    @torch.inference_mode()
    def generate(self, prompt, max_new_tokens=128, temperature=0.0, seed=0,
                 controller: Controller | None = None) -> GenerationResult:
        controller = controller or StaticController()
        controller.reset()
        dev, head = self.device, self.head
        gen = torch.Generator(device=dev).manual_seed(seed)
        res = GenerationResult("eagle3", list(prompt), [])
        cache, hs, out = self._prefill(prompt, temperature, gen, hidden=True)
        n = len(prompt)
        seq, draft_kv = list(prompt) + out, DraftKV()
        pending = head.fuse(hs)                                          # [1, n, H]
        if n > 1:                                                        # head prefill: entries 0 .. n-2
            _, _, kv0 = head(torch.tensor([prompt[1:]], device=dev), pending[:, : n - 1],
                             torch.arange(n - 1, device=dev))
            draft_kv.append(kv0)
            pending = pending[:, n - 1:]
        out, stop = self._finish(out, max_new_tokens)
        last = None
        while stop is None:
            n = len(seq) - 1                                             # seq[n] is the root
            hist = [c.accepted for c in res.cycles]
            shape = controller.plan(StepContext(len(res.cycles), 1, [0], [n], [len(out)], [hist], 0, last=last))
            s0 = draft_kv.length
            g, dlogits, new_kv = head(torch.tensor([seq[s0 + 1: n + 1]], device=dev), pending,
                                      torch.arange(s0, n, device=dev), past_kv=draft_kv.kv)
            draft_kv.append(new_kv)
            pool = expand_tree(head, draft_kv.kv, torch.ones(1, n, dtype=torch.bool, device=dev), g[:, -1],
                               dlogits[:, -1], torch.tensor([n - 1], device=dev), shape.width, shape.depth,
                               context_len=[n], should_continue=controller.continue_drafting)
            tree = select_tree(pool, 0, seq[n], int(controller.verify_size(pool, shape)))
            vlogits, vhs = verify_tree(self.model, tree, n, cache)
            path, bonus = (accept_greedy(tree, vlogits) if temperature <= 0 else
                           accept_sampling(tree, vlogits, temperature, gen))
            keep = [0] + path
            compact_cache(cache, n, keep)
            keep_t = torch.tensor(keep, device=dev)
            pending = head.fuse(tuple(h[:, keep_t] for h in vhs))        # f_n .. f_{n+L}
            before = len(out)
            out, stop = self._finish(out + tree.tokens[keep_t[1:]].tolist() + [bonus], max_new_tokens)
            seq = list(prompt) + out
            last = StepRecord(len(res.cycles), 1, pool.depth, pool.width, tree.size, [0], [n], [len(path)],
                              [len(out) - before], 0)
            controller.observe(last)
            res.cycles.append(CycleRecord(last.step, 1, pool.depth, pool.width, tree.size, len(path),
                                          len(out) - before, n))
        res.output_ids, res.stop_reason = out, stop
        return res
