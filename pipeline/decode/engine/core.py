"""EAGLE-3 decoding at batch size B: B rows decoded together, ONE shape per step (as SGLang and vLLM).

One step (docs/design.md, "Serving at batch size B"), for the A <= B active rows:

    plan  : the batch controller sees B, the rows' contexts and acceptance histories (and, if it
            asks, each root's depth-1 draft confidence) and returns one StepShape (D, W, V)
    draft : one head forward over every row's pending entries (f_t, x_{t+1}), padded to the longest
            -> each root's head output; then D-1 forwards over the A x W beams at once
            (`expand_tree`, each root masked to its own row's head cache); select A trees of V nodes
    verify: one target forward over the A x V tree tokens, row r on its own prefix n_r in its slot
    accept: greedy for all rows with tensor ops (T = 0), or EAGLE's rule row by row with the row's
            own generator (T > 0) -> L_r accepted, one bonus token per row
    commit: per row, compact the accepted path's target KV to n_r .., store its fused features (the
            head's next pending entries), emit L_r + 1 tokens (cut at EOS / max_new_tokens)
    then finished rows leave, and queued prompts take their slots (continuous batching): B stays
    constant while prompts remain. Once the queue is empty a finished row's slot is dropped at once
    (the last live row moves into it), so every forward runs the live rows (padded with graphs, below).

Arrivals (`arrivals=`, s from the call's start, non-decreasing in prompt order): a request may take
a slot only once it has arrived, so under load the batch grows (the next free slots, up to
batch_size) and shrinks with the traffic, as a serving engine's does. The call's clock is the wall
clock with the waits for the next arrival skipped (nothing runs then, so skipping them changes no
timing and saves the wait); each row records its arrival, join and finish times on that clock.
Without arrivals every prompt has arrived at 0: the closed batch above.

Draft KV layout: one slot per row (pipeline/decode/engine/kv.py), each root masked to its own row's
entries, the per-root prefix mask that collection (pipeline/collect/prompt.py) puts on its packed
head KV. Collection packs the prompts into one sequence because many roots share each prompt; here
each row has one root, and `expand_tree` copies the prefix once per root, so packing would copy
B x (all rows' entries) per step where slots copy B x (the longest row's).

Shapes: off (D = 0, V = 1: a plain AR step, no head work), chain (W = 1, V = D + 1) and the EAGLE-3
tree. AR at batch B (`generate_ar`) is the same step with every step off and no features, so
speedups at each B compare like with like.

Exactness: a row's greedy output is its own target-greedy sequence whatever its batch-mates do; in
fp32 it equals its batch-1 AR output token for token (tests/pipeline/decode/engine/test_batch_engine.py), in reduced
precision rows may part at near-ties (pipeline/decode/lossless.py). Row r samples with its own
Generator(seeds[r]), consumed exactly as the batch-1 loop consumed it (tests/pipeline/decode/reference_engine.py),
so at T > 0 a row's output equals its batch-1 run's with the same seed and shapes.

Host syncs: one per step (the accepted lengths and tokens, read once). The step's phase boundaries
are clock marks (pipeline/runtime/clock.py: CUDA events on a GPU, so timing adds no sync), turned
into its record's times when the call ends; the call's own clock reads (start, end, refills,
arrivals) and a level hook's asks do sync. Row bookkeeping (token lists, EOS, refills) is Python.

On a GPU the step's three fixed-shape parts (pipeline/decode/engine/step.py: pending,
draft, greedy verify) run as CUDA graphs (pipeline/runtime/cuda_graphs.py), one per key (A, M, span),
(A, D, W, V, span), (A, V, span), captured the first time a key occurs and replayed after. So that
shapes do not follow the rows' lengths, the keys a step reads, [0, span), are rounded up to a
multiple of `span_bucket` (128 with graphs, else 1) and the pending entries M to a power of two.
Nor may they follow the traffic: with graphs a step over A live rows runs over row_bucket(A) rows
(1, 2, 4, then multiples of 8, vLLM's capture sizes; the pad rows compute what nobody reads), so a
trace that visits A = 1..16 replays the graphs of 5 row counts. The stores are static: made for
the call's most rows (padded) and reused by the next call that fits (`BatchState.alias`); rows
joining and leaving never move them (kv.py: live rows are the first slots, a leaving row's slot
takes the last live row), and a graph's key holds their addresses. Each call's BatchResult counts
the graphs it captured (`captures`). DRAFTGYM_CUDA_GRAPHS=0 or cuda_graphs=False turns graphs off.
"""
from __future__ import annotations

import torch

from pipeline.models import arch
from pipeline.decode.engine import step
from pipeline.decode.engine.admit import HEADROOM, RowAdmission
from pipeline.decode.engine.kv import BatchState
from pipeline.decode.engine.result import BatchResult, RowResult
from pipeline.decode.engine.rows import Call, Rows, check_call
from pipeline.decode.engine.verify import (TreeBatch, accept_greedy_batch, accept_sampling_rows, select_trees,
                                          verify_forward)
from pipeline.decode.controller import (Controller, CycleRecord, StaticController, StepContext, StepRecord,
                                        StepShape, uses_level_hooks, uses_row_budgets)
from pipeline.models.prepare import prepare_modules
from pipeline.models.head import Eagle3Head
from pipeline.decode.tree import log_softmax32
from pipeline.errors import DraftGymError
from pipeline.runtime.clock import DeviceClock
from pipeline.runtime.cuda_graphs import GraphCache

__all__ = ["BatchEngine", "BatchResult", "CycleRecord", "RowResult"]

SPAN_BUCKET = 128  # with CUDA graphs: the key span of a step, rounded up to a multiple of this


def row_bucket(a: int) -> int:
    """The rows a step runs over with CUDA graphs for `a` live rows: 1, 2, 4, then multiples of 8,
    vLLM's CUDA-graph capture sizes (vllm/config/compilation.py; SGLang's `cuda_graph_bs` is alike).
    So a load trace that visits every batch size 1..64 replays at most 11 row counts' graphs."""
    return a if a <= 2 else 4 if a <= 4 else -(-a // 8) * 8


def _no_mark() -> None:
    """An untimed step's phase mark (BatchEngine.timed = False)."""


def pow2_at_least(x: int) -> int:
    return 1 << max(0, x - 1).bit_length()


class BatchEngine(RowAdmission):
    """EAGLE-3 (and AR) generation for one target + one head, B prompts at a time."""

    def __init__(self, model, head: Eagle3Head | None, eos_token_ids: set[int] | None = None,
                 cuda_graphs: bool | None = None, span_bucket: int | None = None, pad_rows: bool | None = None):
        """cuda_graphs: None = on for a CUDA device (unless DRAFTGYM_CUDA_GRAPHS=0); span_bucket: the
        step's key span is rounded up to a multiple of it (default 128 with graphs, else 1); pad_rows:
        run each step over row_bucket(live rows) rows (default: with graphs; kv.py BatchState)."""
        prepare_modules(model, head)            # as Engine: the batch-1 and batch-B engines share kernels
        self.model, self.head = model, head
        self.eos = set(eos_token_ids or ())
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.clock = DeviceClock(self.device)
        self.window = arch.attention_window(model.config)    # sliding window (tokens), None = full attention
        self.graphs = GraphCache(self.device, cuda_graphs)
        self.span_bucket = span_bucket or (SPAN_BUCKET if self.graphs.enabled else 1)
        if self.span_bucket < 1:
            raise DraftGymError(f"span_bucket must be >= 1, got {span_bucket}")
        self.pad_rows = self.graphs.enabled if pad_rows is None else pad_rows
        self._pad = row_bucket if self.pad_rows else int
        self._pad_gen = torch.Generator(device=self.device)  # T > 0: the pad rows' draws (nobody reads them)
        self._static: dict[bool, BatchState] = {}            # the static stores, per features (module docstring)
        self.timed = True               # False: no phase marks, the step records' times stay 0 (a timed run's cost)

    # -- public entries ------------------------------------------------------------------------
    def generate(self, prompts: list[list[int]], max_new_tokens: int | list[int] = 128, temperature: float = 0.0,
                 seeds: int | list[int] = 0, batch_size: int = 8,
                 controller: Controller | None = None, arrivals: list[float] | None = None,
                 max_steps: int | None = None) -> BatchResult:
        """EAGLE-3 at batch size `batch_size` (default controller: the EAGLE-3 tree every step).
        seeds: one for all rows or one per prompt; max_new_tokens likewise. arrivals: each prompt's
        arrival time in s (module docstring); batch_size is then the most rows at once. max_steps:
        stop after that many steps (the profile's timed steps); rows still running keep stop_reason ''."""
        if self.head is None:
            raise DraftGymError("method eagle3 needs an EAGLE-3 head")
        return self._run("eagle3", prompts, max_new_tokens, temperature, seeds, batch_size,
                         controller or StaticController(), features=True, arrivals=arrivals, max_steps=max_steps)

    def generate_ar(self, prompts: list[list[int]], max_new_tokens: int | list[int] = 128, temperature: float = 0.0,
                    seeds: int | list[int] = 0, batch_size: int = 8, arrivals: list[float] | None = None,
                    eos_token_ids=None, on_result=None, stop_refill=None) -> BatchResult:
        """AR at batch size `batch_size`: the same step, off every step, no head and no features.
        The first rows are prefilled several per forward (pipeline/decode/engine/prefill.py).
        eos_token_ids: this call's (default the engine's; empty: every row runs to max_new_tokens);
        on_result(i, row) as prompt i ends; stop_refill() -> True: start no more prompts (those never
        started keep stop_reason ''). Collection's continuations (generate_batch) run here."""
        return self._run("ar", prompts, max_new_tokens, temperature, seeds, batch_size,
                         StaticController(StepShape.off()), features=False, arrivals=arrivals,
                         eos=eos_token_ids, on_result=on_result, stop_refill=stop_refill)

    # -- one call --------------------------------------------------------------------------------
    @torch.inference_mode()
    def _run(self, method, prompts, max_new_tokens, temperature, seeds, batch_size, controller, features,
             arrivals=None, max_steps=None, eos=None, on_result=None, stop_refill=None):
        # a sliding window is never reached (pipeline/models/arch.py: the slot masks are not windowed):
        # the controller's static V counts up front, a larger V chosen mid-generation at its step; the
        # off step's one token is the root, already counted in the new tokens (as Engine.generate_ar)
        shape = getattr(controller, "shape", StepShape())
        tree = shape.verify_size if self.window and not shape.is_off else 0
        if max_steps is not None and max_steps < 1:
            raise DraftGymError(f"max_steps must be >= 1 (or None: until every row ends), got {max_steps}")
        seeds, max_new, arrivals = check_call(self.model.config, prompts, max_new_tokens, temperature, seeds,
                                              batch_size, tree, arrivals)
        res = BatchResult(method, [RowResult(i, list(p), arrival_s=a)
                                   for i, (p, a) in enumerate(zip(prompts, arrivals or [0.0] * len(prompts)))])
        if not prompts:
            return res
        controller.reset()
        t0 = self.clock()
        run = Call(prompts, max_new, seeds, temperature, features, res, queue=list(range(len(prompts)))[::-1],
                   arrival=arrivals, t0=t0, eos=frozenset(self.eos if eos is None else eos), on_result=on_result,
                   stop_refill=stop_refill)
        B = min(batch_size, len(prompts) if arrivals is None else self._arrived(run))
        state = self._stores(B, min(batch_size, len(prompts)),
                             self._span(max(len(p) for p in prompts) + max(max_new) + HEADROOM) + 1, features)
        rows = Rows(B)
        if not features:
            res.prefill_s += self._fill_grouped(state, rows, run)
        for s in range(B):
            if rows.req[s] < 0:
                res.prefill_s += self._fill(s, state, rows, run)
        self._drop_dead(state, rows)
        while (rows.req or run.queue) and (max_steps is None or len(res.steps) < max_steps):
            if not rows.req:                                  # idle: skip the wait for the next arrival
                res.idle_s += max(0.0, run.arrival[run.queue[-1]] - self._now(run))
            self._admit(state, rows, run, batch_size)
            if rows.req:
                self._step(state, rows, run, controller)
        res.wall_s = self.clock() - t0                        # a sync: every mark of the call has completed
        self._step_times(run)
        return res

    def _step_times(self, run: Call) -> None:
        """Each step's times from its marks (`_step`), once the call's last clock read has synced:

            t_draft      start .. plan (the pending forward a confidence-using controller asked for)
                         + planned .. drafted, less the level hooks' time
            t_verify     drafted .. verified (target forward, acceptance, commit, the host read)
            t_controller plan .. planned + the level hooks + observe .. end
            t_step       start .. end (refills after it excluded)

        and each row's cycle of the step gets the step's times (t_cycle = t_step)."""
        sec = self.clock.seconds
        for record, m, t_hooks, cycles in run.marks:
            record.t_draft = sec(m["start"], m["plan"]) + sec(m["planned"], m["drafted"]) - t_hooks
            record.t_verify = sec(m["drafted"], m["verified"])
            record.t_controller = sec(m["plan"], m["planned"]) + t_hooks + sec(m["observe"], m["end"])
            record.t_step = sec(m["start"], m["end"])
            for c in cycles:
                c.t_draft, c.t_verify, c.t_controller = record.t_draft, record.t_verify, record.t_controller
                c.t_cycle = record.t_step
        run.marks.clear()

    def _stores(self, B: int, most: int, S: int, features: bool) -> BatchState:
        """The static stores, B live rows to load, room for `most` rows of capacity >= S (made when
        the last call's do not fit; a call of fewer rows runs on the first slots of larger ones)."""
        st = self._static.get(features)
        slots = self._pad(most)
        if st is None or st.slots < slots or st.capacity < S:
            slots = max(slots, st.slots if st is not None else 0)   # a longer prompt at B = 1 keeps the slots
            self._static.pop(features, None)                 # freed before the new ones are made
            st = self._static[features] = BatchState(self.model, self.head, slots, S, features, self._pad)
        return st.alias(B)

    def release(self) -> None:
        """Free the static stores and the CUDA graphs (the next call makes them again)."""
        self._static.clear()
        self.graphs.clear()

    def _key(self, state: BatchState, *part) -> tuple:
        """A step part's graph key: the part, the stores' rows, capacity and addresses (none without graphs)."""
        return (*part, state.rows, state.capacity, state.buffers()) if self.graphs.enabled else part

    def _span(self, n: int) -> int:
        """Keys [0, span) a step reads to see entries < n: n rounded up to the span bucket."""
        return -(-n // self.span_bucket) * self.span_bucket

    # -- one step ----------------------------------------------------------------------------------
    def _pending_forward(self, state: BatchState):
        """The head over each row's pending entries (step.pending), graphed per (A, M, span).
        Returns each root's head output [A, H] and draft logits [A, draft_vocab]."""
        M = max(n - d for n, d in zip(state.n_host, state.dl_host))
        M = pow2_at_least(M) if self.graphs.enabled else M                                 # a graph per bucket
        span = self._span(max(state.n_host))
        state.ensure(max(span, max(state.dl_host) + M) + 1)
        key = self._key(state, "pending", M, span)
        root = self.graphs.run(key, lambda n, dl: step.pending(self.head, state, n, dl, M, span), state.n, state.dl)
        state.dl, state.dl_host = state.n.clone(), list(state.n_host)
        return root

    def _draft(self, state: BatchState, shape: StepShape, root) -> TreeBatch:
        """D - 1 forwards over the A x W beams (forward 1 was the pending one) and A trees of V
        nodes, graphed per (A, D, W, V, span)."""
        span = self._span(max(state.n_host))
        key = self._key(state, "draft", shape, span)
        fn = lambda n, rh, rl: step.draft_trees(self.head, state, shape, span, n, rh, rl)
        return TreeBatch(*self.graphs.run(key, fn, state.n, *root))

    def _draft_by_level(self, state: BatchState, shape: StepShape, root, controller) -> tuple[TreeBatch, int, float]:
        """A controller's level hooks (B = 1 only): `continue_drafting` after
        each draft level may stop the draft, `verify_size` picks V from the pool, as the batch-1 loop
        asks them. Eager (each ask reads the host); the verify is graphed as any. Returns the trees,
        the depth drafted and the seconds spent in the hooks (device-synchronised, as t_controller)."""
        if state.rows != 1:
            raise DraftGymError(f"a controller with level hooks runs at batch size 1, got {state.live} rows")
        clock, spent = self.clock, [0.0]

        def ask(step):
            a = clock()                                      # the draft level before this ask ends here
            go = controller.continue_drafting(step)
            spent[0] += clock() - a
            return go

        pool = step.draft_pool(self.head, state, shape, self._span(max(state.n_host)), state.n, *root,
                               context_len=state.n_host, should_continue=ask)
        a = clock()
        V = int(controller.verify_size(pool, shape))
        spent[0] += clock() - a
        return select_trees(pool, step.roots(state, state.n), V), pool.depth, spent[0]

    def _draft_budgeted(self, state: BatchState, shape: StepShape, root, controller) -> tuple[TreeBatch, list[int]]:
        """Per-request budgets (chains, T = 0): the chain of D for every row, one host read of its
        drafts' running log-probs [A, D], the controller's kept drafts k_r, and the rows' chains cut
        to max_r k_r + 1 nodes (a chain's pool is in depth order, so that is each chain's prefix).
        Eager, as the level hooks are. Returns the trees and k [live rows]."""
        pool = step.draft_pool(self.head, state, shape, self._span(max(state.n_host)), state.n, *root)
        A, D = state.live, pool.depth
        k = controller.row_budgets(pool.scores[:A].float().cpu().numpy(), shape)
        k = [D] * A if k is None else [int(x) for x in k]
        if len(k) != A or any(not 0 <= x <= D for x in k):
            raise DraftGymError(f"row_budgets gave {k}: one count in 0..{D} per row ({A} rows)")
        return select_trees(pool, step.roots(state, state.n), max(k) + 1), k

    def _verify(self, state: BatchState, trees: TreeBatch | None, run: Call, gens: list,
                caps: list[int] | None = None) -> tuple[list[list[int]], int]:
        """Target forward, acceptance, commit (trees None: the off step, each root alone); with graphs
        and T = 0 one graph per (A, V, span). Returns per row [L, emitted tokens...] (the step's one
        host read) and V. caps: per-request budgets (eager; greedy acceptance cut at each row's k_r)."""
        V = 1 if trees is None else trees.size
        span = self._span(max(state.n_host) + V)
        state.ensure(span + 1)
        tree = () if trees is None else (trees.tokens, trees.parents, trees.depths, trees.mask)
        live = state.live
        if run.T <= 0 and self.graphs.enabled and caps is None:
            key = self._key(state, "verify", V, span, run.features)
            fn = lambda n, *t: step.verify_greedy(self.model, self.head, state, span, run.features, n, *t)
            packed_dev = self.graphs.run(key, fn, state.n, *tree)
            packed = packed_dev.tolist()                                                  # the host sync
        else:              # eager (a CPU; T > 0: EAGLE's rule draws on each row's own generator)
            tb = step.trees_of(state, state.n, tree)
            logits, hs = verify_forward(self.model, tb, state.n, span, state.kv, run.features)
            if run.T <= 0:
                accepted, bonus = (accept_greedy_batch(tb, logits) if caps is None else accept_greedy_batch(
                    tb, logits, torch.tensor(caps + [0] * (state.rows - live), device=logits.device)))
            else:
                accepted, bonus = accept_sampling_rows(tb, logits, run.T, gens + [self._pad_gen] * (state.rows - live))
            packed_dev, order = step.commit(state, state.n, tb, accepted, bonus)
            packed = packed_dev.tolist()                                                  # the host sync
            if hs is not None:
                step.store_features(self.head, state, state.n, order, hs, 1 + max(p[0] for p in packed[:live]))
        grow = packed_dev[:, 0] + 1                                                       # [R]
        if state.rows > live:
            grow[live:] = 0                                                               # pad rows stay at PAD
        state.n = state.n + grow
        packed = packed[:live]
        state.n_host = [n + p[0] + 1 for n, p in zip(state.n_host, packed)] + state.n_host[live:]
        return packed, V

    def _plan(self, state: BatchState, rows: Rows, run: Call, controller: Controller, queued: int,
              marks: dict, mark):
        """Ask the controller for the step's shape. A controller that uses confidences gets each
        root's depth-1 top draft log-prob, from the pending forward run first (its time is t_draft:
        marks "start" .. "plan"). Returns (shape, the pending forward's roots or None)."""
        res = run.res
        root = confidence = None
        if run.features and controller.uses_confidence:
            root = self._pending_forward(state)
            confidence = log_softmax32(root[1][: state.live]).amax(-1)                     # [A]
        ctx = StepContext(step=len(res.steps), batch_size=state.live, rows=list(rows.req),
                          context_lens=state.n_host[: state.live], new_tokens=[len(o) for o in rows.out],
                          history=rows.hist, queued=queued, confidence=confidence,
                          last=res.steps[-1] if res.steps else None)
        marks["plan"] = mark()
        shape = StepShape.of(controller.plan(ctx))
        if shape.depth and not run.features:
            raise DraftGymError(f"step shape {shape.label()} drafts, but this generation has no EAGLE-3 head")
        return shape, root

    def _step(self, state: BatchState, rows: Rows, run: Call, controller: Controller) -> None:
        """One step. Its phase boundaries are clock marks (pipeline/runtime/clock.py: CUDA events on a
        GPU, no host sync each), turned into the record's times when the call ends (`_step_times`)."""
        res, mark = run.res, (self.clock.mark if self.timed else _no_mark)
        A = state.live
        queued = self._arrived(run)
        captures = self.graphs.captures
        marks = {"start": mark()}
        shape, root = self._plan(state, rows, run, controller, queued, marks, mark)
        marks["planned"] = mark()
        depth, t_hooks, caps = shape.depth, 0.0, None
        if shape.is_off:
            trees, width, size = None, 1, 1
        elif shape.width == 1 and uses_row_budgets(controller):
            if run.T > 0:
                raise DraftGymError("per-request budgets (row_budgets) verify greedily: temperature must be 0")
            trees, caps = self._draft_budgeted(state, shape, root or self._pending_forward(state), controller)
            width, size = 1, trees.size
        elif uses_level_hooks(controller):
            trees, depth, t_hooks = self._draft_by_level(state, shape, root or self._pending_forward(state), controller)
            width, size = min(shape.width, self.head.cfg.draft_vocab_size), trees.size
        else:
            trees = self._draft(state, shape, root or self._pending_forward(state))
            width, size = min(shape.width, self.head.cfg.draft_vocab_size), trees.size
        if self.window is not None and max(state.n_host) + size > self.window - 1:
            i = rows.req[max(range(A), key=state.n_host.__getitem__)]          # as Engine: refused at its step
            arch.check_length(self.model.config, len(run.prompts[i]), run.max_new[i], size)
        marks["drafted"] = mark()
        ctx_lens = state.n_host[:A]
        packed, V = self._verify(state, trees, run, rows.gen, caps)
        marks["verified"] = mark()
        record = StepRecord(step=len(res.steps), batch_size=A, depth=depth, width=width, verify_size=V,
                            rows=list(rows.req), context_lens=ctx_lens, accepted=[p[0] for p in packed],
                            emitted=[], queued=queued, captures=self.graphs.captures - captures, row_budgets=caps)
        done = self._emit(rows, record, packed, run)
        for s in done:
            self._finished(run, rows.req[s])
        marks["observe"] = mark()
        controller.observe(record)
        marks["end"] = mark()
        if self.timed:
            run.marks.append((record, marks, t_hooks, [run.res.rows[i].cycles[-1] for i in record.rows]))
        res.steps.append(record)
        for s in done:
            t = self._fill(s, state, rows, run)
            record.t_refill += t
            res.prefill_s += t
        self._drop_dead(state, rows)
