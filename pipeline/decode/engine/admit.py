"""Rows joining and leaving the batched engine (pipeline/decode/engine/core.py): the call's clock and
arrivals, prefills into slots, each row's first token, emitted tokens cut at EOS / max_new_tokens,
and dropping the slots of rows that ended. The engine's step (plan, draft, verify) is in
engine.py; this is its host-side bookkeeping, kept apart so each reads in one place.

A prompt joins when a slot is free and it has arrived (`Call.ready`): the first rows of an AR call are
prefilled several per forward (pipeline/decode/engine/prefill.py), every other prefill runs at batch 1
(as Engine.generate: target forward, then the head over entries 0 .. n-2). Its first token is drawn
from the prefill's last logits with the row's own generator; a row that this token already ends never
takes a slot. A row that ends mid-call hands its slot to the next ready prompt at once; once none is
ready the slot leaves the batch (the last live row moves into it: kv.py BatchState.keep), so every
forward runs the live rows (padded to row_bucket with CUDA graphs).
"""
from __future__ import annotations

import bisect

import torch

from pipeline.decode.engine.kv import BatchState
from pipeline.decode.engine.prefill import prefill_groups
from pipeline.decode.engine.result import cut
from pipeline.decode.engine.rows import Call, Rows
from pipeline.decode.controller import CycleRecord, StepRecord
from pipeline.decode.verify import sample_token, target_forward

HEADROOM = 64     # slot entries past the longest prompt + max_new_tokens (grown when a step needs more)


class RowAdmission:
    """The engine's side that admits, starts, cuts and drops rows (module docstring). Needs from the
    engine: model, head, device, clock."""

    # -- the call's clock and arrivals ---------------------------------------------------------------
    def _now(self, run: Call) -> float:
        """s since the call's start, waits for arrivals skipped (module docstring)."""
        return self.clock() - run.t0 + run.res.idle_s

    def _arrived(self, run: Call) -> int:
        """Requests queued that have arrived by now (all of them without arrival times). Prompts start
        in index order and arrivals do not decrease, so it is (arrived by now) - (started)."""
        if run.arrival is None or not run.queue:
            return len(run.queue)
        started = len(run.prompts) - len(run.queue)
        return max(0, bisect.bisect_right(run.arrival, self._now(run)) - started)

    def _admit(self, state: BatchState, rows: Rows, run: Call, max_batch: int) -> None:
        """Arrived requests take new slots up to max_batch rows (arrivals only; a closed call refills
        in place). The prefills count as the last step's refills."""
        k = min(max_batch - len(rows.req), self._arrived(run)) if run.arrival is not None else 0
        if k <= 0:
            return
        first = len(rows.req)
        state.add(k)
        rows.add(k)
        t = sum(self._fill(s, state, rows, run) for s in range(first, first + k))
        self._drop_dead(state, rows)
        run.res.prefill_s += t
        if run.res.steps:
            run.res.steps[-1].t_refill += t

    # -- rows joining and leaving --------------------------------------------------------------------
    def _fill(self, s: int, state: BatchState, rows: Rows, run: Call) -> float:
        """Prefill queued prompts into slot s (batch 1, as Engine.generate) until one does not finish
        at its first token. Returns the seconds spent."""
        from transformers import DynamicCache

        t0 = self.clock()
        rows.req[s] = -1
        while run.ready(now := self._now(run)):               # one clock read (a device sync on a GPU)
            i = run.queue.pop()
            run.res.rows[i].join_s = now
            p, dev = run.prompts[i], self.device
            cache = DynamicCache(config=self.model.config)
            n = len(p)
            logits, hs = target_forward(self.model, torch.tensor([p], device=dev), torch.arange(n, device=dev)[None],
                                        cache, hidden_states=run.features, last_only=True)
            out, gen = self._first_token(run, i, logits[-1])
            if out is None:                          # finished by its first token: the slot takes the next prompt
                continue
            feats = head_kv = None
            if run.features:                      # the head reads entries 0..n-2 now (as Engine.generate)
                feats = self.head.fuse(hs)           # [1, n, H]
                if n > 1:
                    _, _, head_kv = self.head(torch.tensor([p[1:]], device=dev), feats[:, : n - 1],
                                              torch.arange(n - 1, device=dev), logits=False)
            state.ensure(n + run.max_new[i] + HEADROOM)
            state.load(s, p + out, cache, n, head_kv, max(n - 1, 0), feats)
            rows.set(s, i, out, gen)
            break
        return self.clock() - t0

    def _fill_grouped(self, state: BatchState, rows: Rows, run: Call) -> float:
        """AR only: the first rows' prompts prefilled several per forward (prefill.prefill_groups)
        into slots 0, 1, ...; a prompt its first token ends takes no slot, and the slots left empty
        are filled one by one after. Returns the seconds spent."""
        t0, now = self.clock(), self._now(run)
        take = []
        while len(take) < len(rows.req) and run.ready(now):
            take.append(run.queue.pop())
        slot = 0
        for k, cache, r, logits in prefill_groups(self.model, [run.prompts[i] for i in take]):
            i = take[k]
            run.res.rows[i].join_s = now
            out, gen = self._first_token(run, i, logits)
            if out is not None:
                n = len(run.prompts[i])
                state.ensure(n + run.max_new[i] + HEADROOM)
                state.load(slot, run.prompts[i] + out, cache, n, row=r)
                rows.set(slot, i, out, gen)
                slot += 1
        return self.clock() - t0

    def _first_token(self, run: Call, i: int, logits: torch.Tensor):
        """Prompt i's first token from its prefill's last logits [vocab], drawn with its own generator:
        (tokens, generator), or (None, None) when that token already ends it."""
        gen = torch.Generator(device=self.device).manual_seed(run.seeds[i])
        out, stop = cut([sample_token(logits, run.T, gen)], run.eos, run.max_new[i])
        if stop is None:
            return out, gen
        run.res.rows[i].output_ids, run.res.rows[i].stop_reason = out, stop
        self._finished(run, i)
        return None, None

    def _finished(self, run: Call, i: int) -> None:
        """Prompt i has ended: its finish time, and the caller's on_result."""
        row = run.res.rows[i]
        row.finish_s = self._now(run)
        if run.on_result is not None:
            run.on_result(i, row)

    def _drop_dead(self, state: BatchState, rows: Rows) -> None:
        """Slots left empty (the queue ran dry) leave the batch: the stores keep the live rows only."""
        keep = [s for s, r in enumerate(rows.req) if r >= 0]
        if len(keep) < len(rows.req):
            rows.keep(state.keep(keep))       # none left: an empty batch, which arrivals may grow again

    def _emit(self, rows: Rows, record: StepRecord, packed: list[list[int]], run: Call) -> list[int]:
        """Append each row's tokens, cut at EOS / max_new_tokens; returns the slots that finished."""
        done = []
        for s, p in enumerate(packed):
            i, L = rows.req[s], p[0]
            before = len(rows.out[s])
            rows.out[s], stop = cut(rows.out[s] + p[1 : L + 2], run.eos, run.max_new[i])
            emitted = len(rows.out[s]) - before
            record.emitted.append(emitted)
            rows.hist[s].append(L)
            r = run.res.rows[i]
            r.cycles.append(CycleRecord(record.step, record.batch_size, record.depth, record.width, record.verify_size,
                                        L, emitted, record.context_lens[s]))
            if stop is not None:
                r.output_ids, r.stop_reason = rows.out[s], stop
                done.append(s)
        return done
