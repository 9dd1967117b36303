"""The EAGLE-3 decoding engine on Hugging Face transformers, and its autoregressive baseline.

One cycle (vocabulary: docs/design.md, "Vocabulary"):

    x_0 .. x_{n-1} in the target KV cache, x_n = root (emitted, not yet run by the target)
    draft : head reads the pending entries (f_t, x_{t+1}) up to t = n-1        -> root's W children
            then up to D-1 more forwards over the W beams                      -> pool of candidates
    select: root + top V-1 pool nodes by cumulative draft log-prob             -> tree, mask, positions
    verify: one target forward over the V tree tokens on top of the cache      -> logits, hidden states
    accept: greedy or EAGLE's q = 1 sampling rule                              -> L accepted, 1 bonus
    commit: compact the accepted path's KV entries; their fused features become the head's next
            pending entries; emit L + 1 tokens.

The autoregressive baseline runs the same target forward and the same DynamicCache, one token per
step, so speedups compare like with like.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from pipeline.decode import arch
from pipeline.decode.batch_engine import BatchEngine
from pipeline.decode.controller import (Controller, CycleContext, CycleRecord, OneRowController, StaticController,
                                        TreeShape)
from pipeline.decode.draft import DraftKV, expand_tree
from pipeline.errors import DraftGymError
from pipeline.decode.head import Eagle3Head
from pipeline.decode.prepare import prepare_modules
from pipeline.runtime.clock import DeviceClock
from pipeline.runtime.env import env_flag
from pipeline.decode.tree import select_tree
from pipeline.decode.verify import (accept_greedy, accept_sampling, compact_cache, sample_token, target_forward,
                             verify_tree)


ONE_ENGINE_ENV = "DRAFTGYM_ONE_ENGINE"


@dataclass
class GenerationResult:
    """One generation. tau = sum(emitted) / cycles (vLLM's mean acceptance length); the first token,
    produced by the prefill, belongs to no cycle. tokens_per_s = new_tokens / wall_s, prefill included."""

    method: str
    prompt_ids: list[int]
    output_ids: list[int]           # the new tokens only
    cycles: list[CycleRecord] = field(default_factory=list)
    wall_s: float = 0.0
    prefill_s: float = 0.0
    stop_reason: str = ""           # 'eos' | 'max_new_tokens'

    @property
    def new_tokens(self) -> int:
        return len(self.output_ids)

    @property
    def tau(self) -> float | None:
        if not self.cycles:
            return None
        return sum(c.emitted for c in self.cycles) / len(self.cycles)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_s if self.wall_s > 0 else 0.0

    def summary(self) -> dict:
        return {"method": self.method, "new_tokens": self.new_tokens, "cycles": len(self.cycles),
                "tau": self.tau, "tokens_per_s": self.tokens_per_s, "wall_s": self.wall_s,
                "prefill_s": self.prefill_s, "stop_reason": self.stop_reason}

    def cycle_rows(self) -> list[dict]:
        return [asdict(c) for c in self.cycles]


class Engine:
    """EAGLE-3 (and AR) generation for one target + one head, batch size 1.

    batched: run every generation on the batched engine at B = 1 (pipeline/decode/batch_engine.py:
    static caches, CUDA graphs; a controller's level hooks are asked as here, that step drafting
    eagerly), with the same results and records. None = on a CUDA device, where its graphs make
    the AR step 4.7x faster on an H100 (BENCHMARKS X3); on a CPU the path below stays, 0.3-6 %
    faster there at B = 1 (BENCHMARKS Q1). DRAFTGYM_ONE_ENGINE=1 or 0 overrides that default."""

    def __init__(self, model, head: Eagle3Head | None, eos_token_ids: set[int] | None = None,
                 batched: bool | None = None):
        prepare_modules(model, head)
        self.model = model
        self.head = head
        self.eos = set(eos_token_ids or ())
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        # every clock read waits for the device first (pipeline/runtime/clock.py): right on CUDA's async queue
        self.clock = DeviceClock(self.device)
        self.window = arch.attention_window(model.config)    # sliding window (tokens), None = full attention
        self.max_positions = arch.max_positions(model.config)
        if batched is None:                     # DRAFTGYM_ONE_ENGINE=1 / 0 overrides the device's default
            batched = env_flag(ONE_ENGINE_ENV)
            batched = self.device.type == "cuda" if batched is None else batched
        self.batched = BatchEngine(model, head, self.eos) if batched else None

    # -- shared pieces ------------------------------------------------------------------------
    def _check_prompt(self, prompt_ids, max_new_tokens: int, margin: int) -> None:
        if len(prompt_ids) == 0:
            raise DraftGymError("empty prompt: no input tokens")
        if max_new_tokens < 1:
            raise DraftGymError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        arch.check_length(self.model.config, len(prompt_ids), max_new_tokens, margin)

    def _new_cache(self):
        from transformers import DynamicCache
        return DynamicCache(config=self.model.config)

    def _finish(self, out: list[int], max_new_tokens: int) -> tuple[list[int], str | None]:
        """Cut at the first EOS (kept) or at max_new_tokens; None while generation should go on."""
        for i, t in enumerate(out[:max_new_tokens]):
            if t in self.eos:
                return out[: i + 1], "eos"
        if len(out) >= max_new_tokens:
            return out[:max_new_tokens], "max_new_tokens"
        return out, None

    # -- autoregressive baseline -----------------------------------------------------------------
    @torch.inference_mode()
    def generate_ar(self, prompt_ids: list[int], max_new_tokens: int = 128, temperature: float = 0.0,
                    seed: int = 0) -> GenerationResult:
        if self.batched is not None:             # its call checks the prompt as below
            return _one_row(self.batched.generate_ar([list(prompt_ids)], max_new_tokens, temperature, seed, 1))
        self._check_prompt(prompt_ids, max_new_tokens, 0)
        gen = torch.Generator(device=self.device).manual_seed(seed)
        res = GenerationResult("ar", list(prompt_ids), [])
        clock = self.clock
        t0 = clock()
        cache = self._new_cache()
        ids = torch.tensor([prompt_ids], device=self.device)
        logits, _ = target_forward(self.model, ids, torch.arange(len(prompt_ids), device=self.device)[None], cache,
                                   hidden_states=False, last_only=True)
        out = [sample_token(logits[-1], temperature, gen)]
        res.prefill_s = clock() - t0
        out, stop = self._finish(out, max_new_tokens)
        while stop is None:
            n = len(prompt_ids) + len(out) - 1          # position of the last emitted token
            logits, _ = target_forward(self.model, torch.tensor([[out[-1]]], device=self.device),
                                       torch.tensor([[n]], device=self.device), cache, hidden_states=False)
            out.append(sample_token(logits[-1], temperature, gen))
            out, stop = self._finish(out, max_new_tokens)
        res.wall_s = clock() - t0
        res.output_ids, res.stop_reason = out, stop
        return res

    # -- EAGLE-3 -------------------------------------------------------------------------------
    def verify_commit(self, tree, n: int, cache, temperature: float = 0.0, gen: torch.Generator | None = None):
        """The verify phase of one cycle: one target forward over the V tree tokens on top of the n
        cached ones, acceptance, KV compaction, and the fused features of the kept entries.

        Returns (path, bonus, keep_t, pending_feat): accepted tree indices (root excluded), the bonus
        token, root + path as a tensor, and f_n .. f_{n+L} [1, L+1, H]. The engine's t_verify times
        exactly this call, and `draftgym profile` times it too (pipeline.profiling.timed_ops.verify_op), so the
        latency model's t_verify(V, c) and the measured cycles describe the same work."""
        vlogits, vhs = verify_tree(self.model, tree, n, cache)          # [V, vocab], hidden states
        if temperature <= 0:
            path, bonus = accept_greedy(tree, vlogits)
        else:
            path, bonus = accept_sampling(tree, vlogits, temperature, gen)
        keep = [0] + path                                # tree indices of root + accepted nodes
        compact_cache(cache, n, keep)
        keep_t = torch.tensor(keep, device=self.device)
        pending_feat = self.head.fuse(tuple(h[:, keep_t] for h in vhs))   # f_n .. f_{n+L}
        return path, bonus, keep_t, pending_feat

    @torch.inference_mode()
    def generate(self, prompt_ids: list[int], max_new_tokens: int = 128, temperature: float = 0.0, seed: int = 0,
                 controller: Controller | None = None) -> GenerationResult:
        if self.head is None:
            raise DraftGymError("method eagle3 needs an EAGLE-3 head")
        controller = controller or StaticController()
        if self.batched is not None:             # its call checks the prompt (the window: the controller's V)
            one = OneRowController(controller)
            res = self.batched.generate([list(prompt_ids)], max_new_tokens, temperature, seed, 1, one)
            return _one_row(res, one.finish(res.steps))
        controller.reset()
        # the verify tree counts against a sliding window (pipeline/decode/arch.py): the controller's
        # static V up front; a larger V chosen by a policy mid-generation is refused at its cycle
        self._check_prompt(prompt_ids, max_new_tokens,
                           getattr(controller, "shape", TreeShape()).verify_size if self.window else 0)
        dev, head = self.device, self.head
        gen = torch.Generator(device=dev).manual_seed(seed)
        res = GenerationResult("eagle3", list(prompt_ids), [])
        clock = self.clock                               # each read syncs the device first (pipeline/runtime/clock.py)
        t0 = clock()

        # prefill: target over the prompt -> first token (the first root) and features f_0..f_{n-1}
        cache = self._new_cache()
        n = len(prompt_ids)
        logits, hs = target_forward(self.model, torch.tensor([prompt_ids], device=dev),
                                    torch.arange(n, device=dev)[None], cache, last_only=True)
        out = [sample_token(logits[-1], temperature, gen)]
        seq = list(prompt_ids) + out
        draft_kv = DraftKV()
        pending_feat = head.fuse(hs)                     # [1, n, H]: entries (f_t, x_{t+1}) not yet in draft_kv
        if n > 1:  # head prefill: entries 0..n-2 now, so every cycle's first forward reads only new entries
            _, _, kv0 = head(torch.tensor([prompt_ids[1:]], device=dev), pending_feat[:, : n - 1],
                             torch.arange(n - 1, device=dev))
            draft_kv.append(kv0)
            pending_feat = pending_feat[:, n - 1 :]
        res.prefill_s = clock() - t0
        out, stop = self._finish(out, max_new_tokens)
        last: CycleRecord | None = None
        # a controller that keeps the base class's continue_drafting never stops early: no hook, no clock reads
        asks = type(controller).continue_drafting is not Controller.continue_drafting

        while stop is None:
            # Timed regions (every boundary is a synced clock read, so queued device work is charged to
            # the region that queued it):  [plan] [draft forwards, with the asks' time taken out]
            # [verify_size] [select] -> t_draft  |  [verify + accept + commit] -> t_verify  |  [observe]
            tc0 = clock()
            n = len(seq) - 1                             # tokens in the target cache; seq[n] is the root
            ctx = CycleContext(cycle=len(res.cycles), context_len=n, new_tokens=len(out), last=last)
            shape: TreeShape = controller.plan(ctx)
            d0 = clock()
            t_ctrl = d0 - tc0

            # draft forward 1: the pending entries; the last one reads the root
            m = pending_feat.shape[1]
            s0 = draft_kv.length                         # == n - m
            tok = torch.tensor([seq[s0 + 1 : n + 1]], device=dev)      # x_{t+1} for t = s0..n-1
            g, dlogits, new_kv = head(tok, pending_feat, torch.arange(s0, n, device=dev), past_kv=draft_kv.kv)
            draft_kv.append(new_kv)
            ctrl_time = [0.0]

            def ask(step, _c=controller, _t=ctrl_time):
                a = clock()                              # the draft forward before this ask ends here
                r = _c.continue_drafting(step)
                _t[0] += clock() - a
                return r

            pool = expand_tree(head, draft_kv.kv, torch.ones(1, n, dtype=torch.bool, device=dev),
                               g[:, -1], dlogits[:, -1], torch.tensor([n - 1], device=dev), shape.width,
                               shape.depth, context_len=[n], should_continue=ask if asks else None)
            c0 = clock()
            V = int(controller.verify_size(pool, shape))
            c1 = clock()
            ctrl_time[0] += c1 - c0
            tree = select_tree(pool, 0, seq[n], V)
            if self.window is not None and n + tree.size > self.window - 1:
                arch.check_length(self.model.config, len(prompt_ids), max_new_tokens, tree.size)
            v0 = clock()
            t_draft = v0 - d0 - ctrl_time[0]
            t_ctrl += ctrl_time[0]

            # verify: one target forward over the tree, then acceptance and KV compaction
            path, bonus, keep_t, pending_feat = self.verify_commit(tree, n, cache, temperature, gen)
            t_verify = clock() - v0

            new = tree.tokens[keep_t[1:]].tolist() + [bonus]
            before = len(out)
            out, stop = self._finish(out + new, max_new_tokens)
            seq = list(prompt_ids) + out
            emitted = len(out) - before
            last = CycleRecord(depth=pool.depth, width=pool.width, verify_size=tree.size, accepted=len(path),
                               emitted=emitted, context_len=n, t_draft=t_draft, t_verify=t_verify,
                               t_controller=t_ctrl, t_cycle=0.0)
            c0 = clock()
            controller.observe(last)
            c1 = clock()
            last.t_controller += c1 - c0
            last.t_cycle = c1 - tc0
            res.cycles.append(last)

        res.wall_s = clock() - t0
        res.output_ids, res.stop_reason = out, stop
        return res


def _one_row(res, cycles: list[CycleRecord] | None = None) -> GenerationResult:
    """A batched engine's B = 1 result as the batch-1 engine's (cycles: the records its controller
    saw; an AR call has none)."""
    row = res.rows[0]
    return GenerationResult(res.method, row.prompt_ids, row.output_ids, cycles or [], wall_s=res.wall_s,
                            prefill_s=res.prefill_s, stop_reason=row.stop_reason)
