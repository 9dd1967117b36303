"""`draftgym profile`: latency profile of this device for one target + head -> `latency` Parquet rows.

Ops (docs/design.md, "The latency model"):
  draft_step  one head forward over W beams, per (W, context_len)
  verify      the verify phase over V tree tokens (target forward with hidden states, acceptance,
              KV compaction, feature fusion), per (V, context_len); V = 1 is also the AR step
  policy      one forward of a small MLP policy at batch 1 (LTD-sized); learned policies add their own
              rows with `draftgym profile-policy`
  overhead    per-cycle engine cost outside draft/verify/controller, from real static-default cycles
  prefill     one request's prefill over n prompt tokens (context_len = n), batch 1 as the engines
              prefill a joining request; timed in a loop (timed_ops.prefill_op), per `--prefill-lengths`
Every row has `batch` = 1 (one sequence decoding). `--batch-sizes 1,2,4,8,16` adds draft_step, verify,
overhead and policy rows at each B > 1: the serving step's ops over B rows, sampled from the batched
engine's own steps (pipeline.profiling.batched; batch 1 is always the in-situ profile below).

Method (default, "in situ"): the engine decodes with static trees (D, W, V), D the smallest depth
whose pool holds V - 1 nodes, from prompts of exactly `context_len` tokens, after one warm-up
generation; every cycle's synchronised t_verify is one sample of verify(V, context_len) and
t_draft / D one sample of draft_step(W, context_len) (context_len = the prompt length: the
generation adds at most `--cycle-tokens` to it). Statistics: n, median, p10, p90, mean.
Why in situ: on a CPU the same forward timed in a tight loop (`--isolated`, hot caches, no draft
work in between) ran 13-15 % faster than inside real decoding, and the simulator then overrated
every method by that much (BENCHMARKS.md, E). `--isolated` keeps the tight-loop micro-benchmarks
(pipeline.profiling.timed_ops) as ops `verify_isolated` / `draft_isolated`, for comparison.
Profile alone: never while collection actors or other jobs share the device.
"""
from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pyarrow as pa
from tqdm import tqdm

from pipeline.errors import DraftGymError
from pipeline.profiling.batched import batched_rows
from pipeline.profiling.trust import suspect_cells
from pipeline.profiling.timed_ops import depth_for, draft_op, policy_op, prefill_op, stats_of, time_op, tree_pool, verify_op, verify_width
from pipeline.logs.schema import LATENCY, SCHEMA_VERSION, partition_dir, read_table, table_files, write_atomic

DEFAULT_VERIFY_SIZES = (1, 2, 4, 8, 16, 32, 60, 100, 160, 240)
DEFAULT_CONTEXTS = (32, 128, 512)
DEFAULT_BATCH_SIZES = (1,)
DEFAULT_PREFILL_LENGTHS = (64, 256, 1024)


def measure_overhead(engine, ids: list[int], n_tokens: int = 48) -> list[float]:
    """Per-cycle time not spent in draft, verify or controller, from a real static-default decode of `ids`."""
    engine.generate(ids, 8)
    res = engine.generate(ids, n_tokens)
    return [max(0.0, c.t_overhead) for c in res.cycles]


def in_situ_samples(engine, prompt: Callable[[int, int], list[int]], context_len: int, depth: int, width: int,
                    verify_size: int, cycle_tokens: int, min_cycles: int = 8) -> list:
    """CycleRecords of greedy static (D, W, V) decoding from prompts of exactly `context_len` tokens
    (after a warm-up generation). A prompt whose greedy answer ends at once (EOS) gives no cycles, so
    up to 8 prompt variants are tried until `min_cycles` cycles are in."""
    from pipeline.decode.controller import StaticController

    ctrl = StaticController(depth, width, verify_size)
    cycles, warm = [], False
    for variant in range(8):
        ids = prompt(context_len, variant)
        if not warm:
            engine.generate(ids, 4, controller=ctrl)
            warm = True
        cycles += engine.generate(ids, cycle_tokens, controller=ctrl).cycles
        if len(cycles) >= min_cycles:
            break
    return cycles


PROFILE_REQUESTS = ("Explain how a hash map works, step by step, with a short Python example.",
                    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
                    "List five practical tips for learning a new language as an adult, and explain each.",
                    "Describe the water cycle to a ten-year-old.")


def context_prompt(tokenizer, n: int, variant: int = 0) -> list[int]:
    """A prompt of exactly n tokens: chat-formatted requests tiled in front of one final request
    (the last tokens are always a complete request and the assistant header)."""
    from pipeline.decode.target import encode_prompt

    k = len(PROFILE_REQUESTS)
    last = encode_prompt(tokenizer, PROFILE_REQUESTS[variant % k] + " " * (variant // k))
    filler = encode_prompt(tokenizer, PROFILE_REQUESTS[(variant + 1) % k])
    if len(last) >= n:
        return last[-n:]
    pad = n - len(last)
    return (filler * (pad // len(filler) + 1))[:pad] + last


def run_profile(model: str, head_spec: str, out: str, widths=(10,), verify_sizes=DEFAULT_VERIFY_SIZES,
                contexts=DEFAULT_CONTEXTS, repeats: int = 5, warmup: int = 2, device: str | None = None,
                dtype: str | None = None, progress: bool = True, isolated: bool = False,
                cycle_tokens: int = 24, batch_sizes=DEFAULT_BATCH_SIZES,
                prefill_lengths=DEFAULT_PREFILL_LENGTHS) -> dict:
    """Load the target and head, then `profile_engine`."""
    from pipeline.decode.engine import Engine
    from pipeline.decode.head import load_head_for
    from pipeline.decode.target import load_target

    target = load_target(model, device=device, dtype=dtype)
    head = load_head_for(head_spec, target.model)
    engine = Engine(target.model, head, target.eos_token_ids)
    return profile_engine(engine, target.tokenizer, model, out, widths=widths, verify_sizes=verify_sizes,
                          contexts=contexts, repeats=repeats, warmup=warmup, progress=progress, isolated=isolated,
                          cycle_tokens=cycle_tokens, batch_sizes=batch_sizes, prefill_lengths=prefill_lengths)


def profile_engine(engine, tokenizer, model: str, out: str, widths=(10,), verify_sizes=DEFAULT_VERIFY_SIZES,
                   contexts=DEFAULT_CONTEXTS, repeats: int = 5, warmup: int = 2, progress: bool = True,
                   isolated: bool = False, cycle_tokens: int = 24, batch_sizes=DEFAULT_BATCH_SIZES,
                   prefill_lengths=DEFAULT_PREFILL_LENGTHS, prompt: Callable[[int, int], list[int]] | None = None,
                   deadline: float | None = None) -> dict:
    """Profile a loaded engine (its target and head) into a new `latency` file under `out`: one
    round of `InSituSampler` (plus the isolated ops if asked, and the batched ops at every batch
    size B > 1 of `batch_sizes`, and the prefill at each of `prefill_lengths`; batch 1 is always profiled).
    prompt(c, r) -> a prompt of exactly c tokens, variant r (default: `context_prompt` of the tokenizer;
    a random-weight target without one passes its own). deadline (perf_counter s): batch sizes and
    prefill lengths not started by then are left out (named in the result's `left_out`)."""
    sampler = InSituSampler(engine, tokenizer, model, widths=widths, verify_sizes=verify_sizes, contexts=contexts,
                            repeats=repeats, cycle_tokens=cycle_tokens, prompt=prompt)
    late = lambda: deadline is not None and time.perf_counter() > deadline
    left_out = []
    if isolated:
        for op, W, V, c in tqdm(sampler.isolated_jobs(), desc="profile (isolated)", unit="op", disable=not progress):
            fn = draft_op(engine.head, W, c) if op == "draft_isolated" else verify_op(engine.model, V, c, head=engine.head)
            sampler.extra.append((op, time_op(fn, engine.device, warmup=warmup, repeats=repeats), W, V, c, 1))
    sampler.run_round(progress)
    remeasured = sampler.remeasure()                                       # suspect cells (trust.py), once
    for B in sorted({int(b) for b in batch_sizes} - {1}):                  # batch 1: the in-situ round above
        if late():
            left_out.append(f"batch {B}")
            continue
        rows, n = batched_rows(engine, B, widths, verify_sizes, sampler.contexts, sampler.prompt,
                               repeats=repeats, progress=progress)
        sampler.extra += rows
        remeasured += n
    max_n = engine.model.config.max_position_embeddings - 1
    for n in tqdm(sorted({int(n) for n in prefill_lengths if int(n) <= max_n}), desc="profile (prefill)",
                  unit="length", disable=not progress):
        if late():
            left_out.append(f"prefill {n}")
            continue
        stats = time_op(prefill_op(engine.model, engine.head, n), engine.device, warmup=1, repeats=repeats)
        sampler.extra.append(("prefill", stats, 0, 0, n, 1))
    res = sampler.write(out)
    res["remeasured"], res["left_out"] = remeasured, left_out
    return res


class InSituSampler:
    """In-situ timing samples of a loaded engine, gathered in rounds over the (V, c) / (W, c) grid.

    One round runs every tree of the grid once (`run_round`, or a few trees at a time with `step`);
    samples of all rounds are pooled, and `write` turns them into one profile. Why rounds: on a shared
    VM the cost of a multi-token forward drifts by up to 2x within minutes (BENCHMARKS.md E2), so
    `draftgym validate --profile-interleave` spreads rounds between its generations, and the pooled
    profile then samples the same machine states as the decoding it predicts."""

    def __init__(self, engine, tokenizer, model: str, widths=(10,), verify_sizes=DEFAULT_VERIFY_SIZES,
                 contexts=DEFAULT_CONTEXTS, repeats: int = 5, cycle_tokens: int = 24,
                 prompt: Callable[[int, int], list[int]] | None = None):
        """prompt(c, r): a prompt of exactly c tokens, variant r (default `context_prompt` of the tokenizer)."""
        from pipeline.decode.target import encode_prompt

        self.engine, self.model = engine, model
        self.prompt = prompt or (lambda c, r: context_prompt(tokenizer, c, r))
        # the overhead's decode: one short request (a prompt of 24 tokens where no tokenizer is given)
        self.overhead_ids = (encode_prompt(tokenizer, "Explain how a hash map works, step by step.")
                             if tokenizer is not None else self.prompt(24, 0))
        self.widths, self.verify_sizes, self.repeats, self.cycle_tokens = tuple(widths), tuple(verify_sizes), repeats, cycle_tokens
        max_ctx = engine.model.config.max_position_embeddings - max(verify_sizes) - cycle_tokens - 1
        self.contexts = [c for c in contexts if c <= max_ctx]
        if not self.contexts:
            raise DraftGymError(f"no profiling context length fits the target's {max_ctx} positions")
        # in situ: real static-tree cycles. verify per (V, c) with the first width whose tree holds V
        # nodes (timed_ops.verify_width); draft per (W, c),
        # pooled over those trees (and, for further widths, over one 2-level tree each)
        self.jobs = [(verify_width(V, self.widths), V, c, True) for c in self.contexts for V in self.verify_sizes] + \
                    [(W, min(1 + W, max(self.verify_sizes)), c, False) for W in self.widths[1:] for c in self.contexts]
        self.verify: dict[tuple[int, int], list[float]] = {}
        self.drafts: dict[tuple[int, int], list[float]] = {}
        self.overhead: list[float] = []
        self.extra: list[tuple] = []          # (op, stats, W, V, c, batch) rows added as they are
        self.done = 0                         # trees run, over all rounds
        self.rounds = 0
        # drift: the same samples again, grouped by the stretch of time they were taken in (the caller
        # names it, e.g. validate names each dataset's decoding); see speed_factor
        self.segment: str | None = None
        self.by_segment: dict[str | None, dict[tuple, list[float]]] = {}

    def isolated_jobs(self):
        return [("draft_isolated", W, 0, c) for W in self.widths for c in self.contexts] + \
               [("verify_isolated", 0, V, c) for V in self.verify_sizes for c in self.contexts]

    def _run(self, job) -> None:
        W, V, c, timed_verify = job
        D = depth_for(V, W) if timed_verify else 2
        cyc = in_situ_samples(self.engine, self.prompt, c, D, W, V, self.cycle_tokens, min_cycles=max(self.repeats, 8))
        cyc = [x for x in cyc if x.verify_size == min(V, 1 + tree_pool(D, W))]
        if not cyc:
            raise DraftGymError(f"profile: no cycles of the static tree ({D}, {W}, {V}) at context {c}")
        seg = self.by_segment.setdefault(self.segment, {})
        if timed_verify:
            t_verify = [x.t_verify for x in cyc]
            self.verify.setdefault((V, c), []).extend(t_verify)
            seg.setdefault(("verify", V, c), []).extend(t_verify)
        t_draft_step = [x.t_draft / x.depth for x in cyc]
        self.drafts.setdefault((W, c), []).extend(t_draft_step)
        seg.setdefault(("draft", W, c), []).extend(t_draft_step)
        self.done += 1

    def cells(self) -> list[dict]:
        """The batch-1 verify and draft_step cells so far, as LATENCY-like rows (for trust.py)."""
        return [{"op": "verify", "verify_size": V, "context_len": c, "batch": 1, **stats_of(ts)}
                for (V, c), ts in self.verify.items()] + \
               [{"op": "draft_step", "width": W, "context_len": c, "batch": 1, **stats_of(ts)}
                for (W, c), ts in self.drafts.items()]

    def remeasure(self) -> int:
        """Run again, once, the trees behind each suspect cell (pipeline/profiling/trust.py: a wild
        spread or out of order), its old samples dropped. Returns the number of cells re-measured;
        any still suspect are named by `tune` and `serve-eval`, which leave them out."""
        sus = suspect_cells(self.cells())
        for x in sus:
            (self.verify if x.op == "verify" else self.drafts).pop((x.size, x.context), None)
        redo = lambda j: any((j[3] and x.op == "verify" and (j[1], j[2]) == (x.size, x.context))
                             or (x.op == "draft_step" and (j[0], j[2]) == (x.size, x.context)) for x in sus)
        for job in [j for j in self.jobs if redo(j)]:
            self._run(job)
        return len(sus)

    def speed_factor(self, segment: str | None) -> tuple[float, int] | None:
        """How much slower (> 1) the machine ran during `segment` than over all samples pooled:
        the median over the cells (verify (V, c) and draft (W, c)) that segment sampled of
        mean(its samples) / mean(all samples of the cell). One number from many cells, so a noisy
        cell moves it little. Returns (factor, cells), or None when the segment sampled nothing."""
        seg = self.by_segment.get(segment) or {}
        ratios = []
        for (op, a, c), ts in seg.items():
            pooled = self.verify[(a, c)] if op == "verify" else self.drafts[(a, c)]
            ratios.append(np.mean(ts) / np.mean(pooled))
        return (float(np.median(ratios)), len(ratios)) if ratios else None

    def step(self, n_trees: int = 1) -> None:
        """Run the next n trees of the grid (cycling through it); a round ends every len(jobs) trees.
        Each round also samples the per-cycle overhead once (from a short static-default decode)."""
        for _ in range(n_trees):
            self._run(self.jobs[self.done % len(self.jobs)])
            if self.done % len(self.jobs) == 0:
                self.rounds += 1
                self.overhead += measure_overhead(self.engine, self.overhead_ids)

    def run_round(self, progress: bool = True) -> None:
        """Finish the current round (all of the grid when none is under way)."""
        left = len(self.jobs) - self.done % len(self.jobs)
        for _ in tqdm(range(left), desc="profile", unit="tree", disable=not progress):
            self.step(1)

    def write(self, out: str) -> dict:
        """One profile (a new profile_id) of every sample so far -> `<out>/latency/...parquet`."""
        dev = self.engine.device
        profile_id = new_profile_id()
        rows = []
        row = row_maker(self.engine, self.model, profile_id)
        add = lambda *a, **k: rows.append(row(*a, **k))
        for op, stats, W, V, c, B in self.extra:
            add(op, stats, width=W, verify_size=V, context_len=c, batch=B)
        for (V, c), ts in self.verify.items():
            add("verify", stats_of(ts), verify_size=V, context_len=c)
        for (W, c), ts in self.drafts.items():
            add("draft_step", stats_of(ts), width=W, context_len=c)
        add("policy", time_op(policy_op(device=dev), dev, warmup=5, repeats=50))
        if not self.overhead:
            self.overhead = measure_overhead(self.engine, self.overhead_ids)
        add("overhead", stats_of(self.overhead), width=10, verify_size=60)
        path = write_profile(rows, out, self.model, profile_id)
        return {"profile_id": profile_id, "device": rows[0]["device"], "dtype": rows[0]["dtype"], "rows": len(rows),
                "path": str(path), "rounds": self.rounds, "trees": self.done}


def new_profile_id() -> str:
    """`<timestamp>-<6 hex>`: sorted ids put the newest last (LatencyModel.from_rows picks it)."""
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"


def row_maker(engine, model: str, profile_id: str) -> Callable[..., dict]:
    """row(op, stats, width=0, verify_size=0, context_len=0, batch=1) -> one LATENCY row of `engine`
    (its device, dtype, head and environment fingerprint) in profile `profile_id`."""
    from pipeline.runtime.fingerprint import device_name, dtype_name, environment_fingerprint

    dev, dtype = engine.device, dtype_name(engine.dtype)
    env = json.dumps(environment_fingerprint(dev, dtype))

    def row(op, stats, width=0, verify_size=0, context_len=0, batch=1) -> dict:
        return {"schema_version": SCHEMA_VERSION, "profile_id": profile_id, "device": device_name(dev, dtype),
                "device_type": dev.type, "model_id": model, "head_id": engine.head.head_id, "dtype": dtype, "op": op,
                "width": width, "verify_size": verify_size, "context_len": context_len, "batch": batch, "n": stats["n"],
                "median": stats["median"], "p10": stats["p10"], "p90": stats["p90"], "mean": stats["mean"],
                "env_json": env}
    return row


def write_profile(rows: list[dict], out: str, model: str, name: str):
    """LATENCY rows -> `<out>/latency/.../<name>.parquet` (atomic), the file name starting with the
    profile id (a profile's later rows, e.g. policy call costs, get files of their own beside it).
    Returns the path."""
    path = partition_dir(out, "latency", model, "_profile", 0.0).parent.parent / f"{name}.parquet"
    write_atomic(pa.Table.from_pylist(rows, schema=LATENCY), path, "latency")
    return path


def profile_rows(root: str, profile_id: str) -> list[dict]:
    """Every LATENCY row of profile `profile_id` under `<root>/latency` (checked reads)."""
    return [r for f in table_files(root, "latency") for r in read_table(f, "latency").to_pylist()
            if r["profile_id"] == profile_id]


@dataclass
class ProfileConfig:
    """`draftgym profile`: this device's latency profile for one target + head, into OUT/latency/."""

    model: str = "smollm2-135m"                   # target: 'smollm2-135m' (embedded), a HF model directory or a hub id
    head: str = "default"                         # EAGLE-3 head: 'default', 'random', a directory or a hub id
    widths: tuple = (10,)                         # W values to time draft forwards at
    verify_sizes: tuple = DEFAULT_VERIFY_SIZES    # V values to time verification at
    contexts: tuple = DEFAULT_CONTEXTS            # context lengths
    repeats: int = 5                              # at least this many cycles (in situ) or timed calls (isolated)
    cycle_tokens: int = 24                        # in situ: new tokens per profiling generation
    isolated: bool = False                        # also time the bare ops in a tight loop (verify_isolated / draft_isolated)
    batch_sizes: tuple = DEFAULT_BATCH_SIZES      # batch sizes B of the draft_step / verify / policy rows (1 always)
    prefill_lengths: tuple = DEFAULT_PREFILL_LENGTHS  # prompt lengths n of the prefill rows (() = none)
    device: str | None = None                     # None: cuda if present, else cpu
    dtype: str | None = None                      # None: the device's default (pipeline.decode.target.resolve_dtype_name)
    out: str = "data/logs"                        # logs root: the profile goes to OUT/latency/
    as_json: bool = False                         # print the summary as one JSON object
    progress: bool = True                         # progress bars


def run_profile_command(cfg: ProfileConfig) -> int:
    if cfg.head not in ("random", "default"):
        from pipeline.decode.head import resolve_head_dir
        resolve_head_dir(cfg.head)
    r = run_profile(cfg.model, cfg.head, cfg.out, widths=cfg.widths, verify_sizes=cfg.verify_sizes,
                    contexts=cfg.contexts, repeats=cfg.repeats, device=cfg.device, dtype=cfg.dtype,
                    isolated=cfg.isolated, cycle_tokens=cfg.cycle_tokens, progress=cfg.progress,
                    batch_sizes=cfg.batch_sizes, prefill_lengths=cfg.prefill_lengths)
    print(json.dumps(r) if cfg.as_json else f"profiled {r['rows']} ops on {r['device']} -> {r['path']}"
          + (f" ({r['remeasured']} suspect cells re-measured)" if r["remeasured"] else ""))
    return 0
