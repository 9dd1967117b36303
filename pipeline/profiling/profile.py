"""`draftgym profile`: latency profile of this device for one target + head -> `latency` Parquet rows.

Ops (docs/design.md, "The latency model"), each per batch size B (`--batch-sizes`, 1 always):
  draft_step  one head forward over B rows x W beams, per (W, context_len, B)
  verify      the verify phase over B x V tree tokens (target forward with hidden states, acceptance,
              KV compaction, feature fusion), per (V, context_len, B); V = 1 is the AR step
  overhead    the step's engine cost outside draft / verify / controller, per (context_len, B)
  policy      one forward of a small MLP policy over B observations (LTD-sized); learned policies add
              their own rows with `draftgym profile-policy`
  prefill     one request's prefill over n prompt tokens (context_len = n), batch 1 as the engines
              prefill a joining request; timed in a loop (timed_ops.prefill_op), per `--prefill-lengths`

Method: the one engine's own steps at every B (pipeline/profiling/steps.py: for each (B, c), B
prompts of exactly c tokens prefilled once, then one generation playing the grid's static shapes
round-robin, one warm-up round dropped and `--repeats` rounds kept; each step's t_verify, t_draft / D
and the rest of t_step are one sample each). Batch 1 is B = 1 of the same path: the profile that
`tune` reads at B = 64 and the one a batch-1 policy is trained on are measured alike. Statistics:
n, median, p10, p90, mean. A cell that spreads wildly or breaks the order in V, B or c
(pipeline/profiling/trust.py) is measured once more, and a (B, c) whose cells are too few for their
spread (a median known to worse than 3 %) runs once more. `--isolated` adds the tight-loop
micro-benchmarks (pipeline.profiling.timed_ops) as ops `verify_isolated` / `draft_isolated`, for
comparison: on a CPU they run 13-15 % faster than the same forward inside real decoding.
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
from pipeline.profiling.steps import TOKENS_PER_STEP, grid_shapes, rows_of, step_samples, suspect_keys
from pipeline.profiling.timed_ops import draft_op, policy_op, prefill_op, time_op, verify_op
from pipeline.profiling.trust import JUDGED, REL_SE_MAX, rel_se
from pipeline.logs.schema import LATENCY, SCHEMA_VERSION, partition_dir, read_table, table_files, write_atomic

DEFAULT_VERIFY_SIZES = (1, 2, 4, 8, 16, 32, 60, 100, 160, 240)
DEFAULT_CONTEXTS = (32, 128, 512)
DEFAULT_BATCH_SIZES = (1,)
DEFAULT_PREFILL_LENGTHS = (64, 256, 1024)


PROFILE_REQUESTS = ("Explain how a hash map works, step by step, with a short Python example.",
                    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
                    "List five practical tips for learning a new language as an adult, and explain each.",
                    "Describe the water cycle to a ten-year-old.")


def context_prompt(tokenizer, n: int, variant: int = 0) -> list[int]:
    """A prompt of exactly n tokens: chat-formatted requests tiled in front of one final request
    (the last tokens are always a complete request and the assistant header)."""
    from pipeline.models.target import encode_prompt

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
                batch_sizes=DEFAULT_BATCH_SIZES, prefill_lengths=DEFAULT_PREFILL_LENGTHS, rounds: int = 1,
                top_ups: int = 1) -> dict:
    """Load the target and head, then `profile_engine`."""
    from pipeline.decode.engine.single import Engine
    from pipeline.models.head import load_head_for
    from pipeline.models.target import load_target

    target = load_target(model, device=device, dtype=dtype)
    head = load_head_for(head_spec, target.model)
    engine = Engine(target.model, head, target.eos_token_ids)
    return profile_engine(engine, target.tokenizer, model, out, widths=widths, verify_sizes=verify_sizes,
                          contexts=contexts, repeats=repeats, warmup=warmup, progress=progress, isolated=isolated,
                          batch_sizes=batch_sizes, prefill_lengths=prefill_lengths, rounds=rounds, top_ups=top_ups)


def profile_engine(engine, tokenizer, model: str, out: str, widths=(10,), verify_sizes=DEFAULT_VERIFY_SIZES,
                   contexts=DEFAULT_CONTEXTS, repeats: int = 5, warmup: int = 2, progress: bool = True,
                   isolated: bool = False, batch_sizes=DEFAULT_BATCH_SIZES,
                   prefill_lengths=DEFAULT_PREFILL_LENGTHS, prompt: Callable[[int, int], list[int]] | None = None,
                   deadline: float | None = None, rounds: int = 1, top_ups: int = 1) -> dict:
    """Profile a loaded engine (its target and head) into a new `latency` file under `out`: `rounds`
    rounds of `ProfileSampler` through every batch size of `batch_sizes` (1 always) and context, its
    suspect cells re-measured once, plus the isolated ops if asked (batch 1, `warmup` untimed calls)
    and the prefill at each of `prefill_lengths`; up to `top_ups` times, the (B, c) jobs whose cells are
    too few for their spread run once more (ProfileSampler.top_up; 0: never). prompt(c, r) -> a prompt of exactly c tokens, variant r
    (default: `context_prompt` of the tokenizer; a random-weight target without one passes its own).
    deadline (perf_counter s): batch sizes and prefill lengths not started by then are left out
    (named in the result's `left_out`); a later round stops at it, its cells keep the earlier rounds'
    samples.

    Why rounds > 1: one round measures each (B, c) in one stretch of time, so on a machine whose speed
    drifts a whole batch level can come out dear or cheap against the others (docs/benchmarks/
    2026-11-27-replay-error-split.md, split-4). K rounds of `repeats` each pool every cell's samples
    from K stretches spread over the whole profile."""
    if rounds < 1:
        raise DraftGymError(f"profile: rounds must be >= 1, got {rounds}")
    sampler = ProfileSampler(engine, tokenizer, model, widths=widths, verify_sizes=verify_sizes, contexts=contexts,
                             batch_sizes={1, *batch_sizes}, repeats=repeats, prompt=prompt)
    late = lambda: deadline is not None and time.perf_counter() > deadline
    if isolated:
        for op, W, V, c in tqdm(sampler.isolated_jobs(), desc="profile (isolated)", unit="op", disable=not progress):
            fn = draft_op(engine.head, W, c) if op == "draft_isolated" else verify_op(engine.model, V, c, head=engine.head)
            sampler.extra.append((op, time_op(fn, engine.device, warmup=warmup, repeats=repeats), W, V, c, 1))
    left_out = sampler.run_round(progress, deadline)
    for _ in range(rounds - 1):
        if late():
            break
        sampler.run_round(progress, deadline)                              # cells it skips keep round 1's samples
    remeasured = sampler.remeasure()                                       # suspect cells (trust.py), once
    topped_up = 0
    for _ in range(top_ups):                                               # cells too few for their spread
        n = sampler.top_up()
        topped_up += n
        if not n or late():
            break
    max_n = engine.model.config.max_position_embeddings - 1
    for n in tqdm(sorted({int(n) for n in prefill_lengths if int(n) <= max_n}), desc="profile (prefill)",
                  unit="length", disable=not progress):
        if late():
            left_out.append(f"prefill {n}")
            continue
        stats = time_op(prefill_op(engine.model, engine.head, n), engine.device, warmup=1, repeats=repeats)
        sampler.extra.append(("prefill", stats, 0, 0, n, 1))
    res = sampler.write(out)
    res["remeasured"], res["topped_up"], res["left_out"] = remeasured, topped_up, left_out
    return res


class ProfileSampler:
    """Step samples of a loaded engine (pipeline/profiling/steps.py) at every (B, c) of a grid, in rounds.

    A job is one (B, c): one generation of B rows from c-token prompts playing the grid's shapes,
    `warmup` rounds dropped and `repeats` kept. One round runs every job once (`run_round`, or a few
    jobs at a time with `step`); samples of all rounds are pooled, and `rows` / `write` turn them into
    one profile. Batch 1 is B = 1 of the same jobs. Why rounds: on a shared VM the cost of a
    multi-token forward can drift by up to 2x within minutes, so `draftgym validate
    --profile-interleave` spreads rounds between its generations, and the pooled profile then samples
    the same machine states as the decoding it predicts."""

    def __init__(self, engine, tokenizer, model: str, widths=(10,), verify_sizes=DEFAULT_VERIFY_SIZES,
                 contexts=DEFAULT_CONTEXTS, batch_sizes=DEFAULT_BATCH_SIZES, repeats: int = 5, warmup: int = 1,
                 prompt: Callable[[int, int], list[int]] | None = None):
        """engine: an Engine or BatchEngine (its model and head; the sampler decodes with its own
        BatchEngine without EOS, so the rows stay B). prompt(c, r): a prompt of exactly c tokens,
        variant r (default `context_prompt` of the tokenizer)."""
        from pipeline.decode.engine.core import BatchEngine

        if repeats < 1:
            raise DraftGymError(f"profile: repeats must be >= 1, got {repeats}")
        self.engine, self.model = engine, model
        self.eng = BatchEngine(engine.model, engine.head, eos_token_ids=set())
        self.prompt = prompt or (lambda c, r: context_prompt(tokenizer, c, r))
        self.widths, self.verify_sizes = tuple(widths), tuple(verify_sizes)
        self.repeats, self.warmup = repeats, warmup
        self.shapes = grid_shapes(self.widths, self.verify_sizes)
        # a job's generation may emit up to TOKENS_PER_STEP a step: its prompts must leave room for it
        max_ctx = engine.model.config.max_position_embeddings - (warmup + repeats) * len(self.shapes) * TOKENS_PER_STEP
        self.contexts = [c for c in contexts if c <= max_ctx]
        if not self.contexts:
            raise DraftGymError(f"no profiling context length fits the target's positions (at most {max_ctx} here)")
        self.batch_sizes = tuple(sorted({int(b) for b in batch_sizes}))
        self.jobs = [(B, c) for B in self.batch_sizes for c in self.contexts]
        self.samples: dict[tuple, list[float]] = {}    # (op, W, V, c, B) -> seconds, every round pooled
        self.extra: list[tuple] = []          # (op, stats, W, V, c, batch) rows added as they are
        self.done = 0                         # jobs run, over all rounds
        self.rounds = 0
        # drift: the same samples again, grouped by the stretch of time they were taken in (the caller
        # names it, e.g. validate names each dataset's decoding); see speed_factor
        self.segment: str | None = None
        self.by_segment: dict[str | None, dict[tuple, list[float]]] = {}

    def isolated_jobs(self):
        return [("draft_isolated", W, 0, c) for W in self.widths for c in self.contexts] + \
               [("verify_isolated", 0, V, c) for V in self.verify_sizes for c in self.contexts]

    def _sample(self, job) -> dict[tuple, list[float]]:
        B, c = job
        return step_samples(self.eng, B, self.shapes, c, self.prompt, self.repeats, self.warmup)

    def _run(self, job) -> None:
        got = self._sample(job)
        if not got:
            raise DraftGymError(f"profile: no full steps at batch {job[0]}, context {job[1]}")
        seg = self.by_segment.setdefault(self.segment, {})
        for key, ts in got.items():
            self.samples.setdefault(key, []).extend(ts)
            seg.setdefault(key, []).extend(ts)

    def _advance(self) -> None:
        """One job of the grid done (run or skipped); a round ends every len(jobs) jobs."""
        self.done += 1
        if self.done % len(self.jobs) == 0:
            self.rounds += 1

    def remeasure(self) -> int:
        """Run each job with a suspect cell once more (pipeline/profiling/trust.py: a wild spread or out
        of order in V or B); the suspect cells take the new samples, one generation per round run so
        far (a re-measured cell has as many samples as its neighbours, not one round's). Returns the
        number of cells re-measured; any still suspect are named by `tune` and `serve-eval`, which
        leave them out."""
        bad = suspect_keys(self.samples)
        for job in [j for j in self.jobs if any((k[4], k[3]) == j for k in bad)]:
            again: dict[tuple, list[float]] = {}
            for _ in range(max(1, self.rounds)):
                for k, ts in self._sample(job).items():
                    again.setdefault(k, []).extend(ts)
            for k in bad:
                if (k[4], k[3]) == job and k in again:
                    self.samples[k] = again[k]
        return len(bad)

    def top_up(self, rel_se_max: float = REL_SE_MAX) -> int:
        """Size each cell's samples by its spread: run once more each job one of whose judged cells
        (verify, draft_step) knows its median to worse than rel_se_max (pipeline/profiling/trust.py
        rel_se); every cell of that job gains one generation's samples. Returns the jobs run."""
        loose = {(k[4], k[3]) for k, ts in self.samples.items() if k[0] in JUDGED and rel_se(ts) > rel_se_max}
        for job in [j for j in self.jobs if j in loose]:
            self._run(job)
        return len(loose)

    def speed_factor(self, segment: str | None) -> tuple[float, int] | None:
        """How much slower (> 1) the machine ran during `segment` than over all samples pooled:
        the median over the cells that segment sampled of mean(its samples) / mean(all samples of
        the cell). One number from many cells, so a noisy cell moves it little. Returns (factor,
        cells), or None when the segment sampled nothing."""
        seg = self.by_segment.get(segment) or {}
        ratios = [np.mean(ts) / np.mean(self.samples[key]) for key, ts in seg.items()]
        return (float(np.median(ratios)), len(ratios)) if ratios else None

    def step(self, n_jobs: int = 1) -> None:
        """Run the next n jobs of the grid (cycling through it); a round ends every len(jobs) jobs."""
        for _ in range(n_jobs):
            self._run(self.jobs[self.done % len(self.jobs)])
            self._advance()

    def run_round(self, progress: bool = True, deadline: float | None = None) -> list[str]:
        """Finish the current round (all of the grid when none is under way). deadline (perf_counter
        s): a batch size none of whose jobs has started by then is skipped (the smallest never is);
        returns those as ["batch B", ...]."""
        left_out, started = [], set()
        for _ in tqdm(range(len(self.jobs) - self.done % len(self.jobs)), desc="profile", unit="job",
                      disable=not progress):
            B = self.jobs[self.done % len(self.jobs)][0]
            late = deadline is not None and time.perf_counter() > deadline
            if B not in started and B != self.batch_sizes[0] and late:
                if f"batch {B}" not in left_out:
                    left_out.append(f"batch {B}")
                self._advance()                    # skipped, so the round still ends where it should
                continue
            started.add(B)
            self.step(1)
        return left_out

    def rows(self) -> list[tuple]:
        """Latency rows (op, stats, W, V, c, B) of every sample so far, a policy row per batch size
        sampled, and the rows added to `extra`."""
        dev = self.engine.device
        sampled = sorted({k[4] for k in self.samples})
        pol = [("policy", time_op(policy_op(device=dev, batch=B), dev, warmup=5, repeats=50), 0, 0, 0, B)
               for B in sampled]
        return list(self.extra) + rows_of(self.samples) + pol

    def write(self, out: str) -> dict:
        """One profile (a new profile_id) of every sample so far -> `<out>/latency/...parquet`."""
        profile_id = new_profile_id()
        row = row_maker(self.engine, self.model, profile_id, padded=self.eng.pad_rows)
        rows = [row(op, stats, width=W, verify_size=V, context_len=c, batch=B) for op, stats, W, V, c, B in self.rows()]
        path = write_profile(rows, out, self.model, profile_id)
        return {"profile_id": profile_id, "device": rows[0]["device"], "dtype": rows[0]["dtype"], "rows": len(rows),
                "path": str(path), "rounds": self.rounds, "jobs": self.done}


def new_profile_id() -> str:
    """`<timestamp>-<6 hex>`: sorted ids put the newest last (LatencyModel.from_rows picks it)."""
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"


def row_maker(engine, model: str, profile_id: str, padded: bool = False) -> Callable[..., dict]:
    """row(op, stats, width=0, verify_size=0, context_len=0, batch=1) -> one LATENCY row of `engine`
    (its device, dtype, head and environment fingerprint) in profile `profile_id`. padded: the
    engine runs a step of B rows over row_bucket(B) rows (CUDA graphs): env "row_bucket", which
    the replay follows (simulator/latency/model.py)."""
    from pipeline.runtime.fingerprint import device_name, dtype_name, environment_fingerprint

    dev, dtype = engine.device, dtype_name(engine.dtype)
    env = json.dumps({**environment_fingerprint(dev, dtype), **({"row_bucket": True} if padded else {})})

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
    repeats: int = 5                              # timed rounds per (B, context) generation (and timed calls, isolated)
    rounds: int = 1                               # passes through the whole (B, context) grid, `repeats` each: > 1 spreads
                                                  # each cell over the profile's time
    top_ups: int = 1                              # times a (B, context) whose cells know their median to worse than 3 %
                                                  # runs once more (0: never)
    isolated: bool = False                        # also time the bare ops in a tight loop (verify_isolated / draft_isolated)
    batch_sizes: tuple = DEFAULT_BATCH_SIZES      # batch sizes B of the draft_step / verify / policy rows (1 always)
    prefill_lengths: tuple = DEFAULT_PREFILL_LENGTHS  # prompt lengths n of the prefill rows (() = none)
    device: str | None = None                     # None: cuda if present, else cpu
    dtype: str | None = None                      # None: the device's default (pipeline.models.target.resolve_dtype_name)
    out: str = "data/logs"                        # logs root: the profile goes to OUT/latency/
    as_json: bool = False                         # print the summary as one JSON object
    progress: bool = True                         # progress bars


def run_profile_command(cfg: ProfileConfig) -> int:
    if cfg.head not in ("random", "default"):
        from pipeline.models.head import resolve_head_dir
        resolve_head_dir(cfg.head)
    r = run_profile(cfg.model, cfg.head, cfg.out, widths=cfg.widths, verify_sizes=cfg.verify_sizes,
                    contexts=cfg.contexts, repeats=cfg.repeats, device=cfg.device, dtype=cfg.dtype,
                    isolated=cfg.isolated, progress=cfg.progress,
                    batch_sizes=cfg.batch_sizes, prefill_lengths=cfg.prefill_lengths, rounds=cfg.rounds,
                    top_ups=cfg.top_ups)
    print(json.dumps(r) if cfg.as_json else f"profiled {r['rows']} ops on {r['device']} -> {r['path']}"
          + (f" ({r['remeasured']} suspect cells re-measured)" if r["remeasured"] else "")
          + (f" ({r['topped_up']} (B, c) sampled once more for their spread)" if r.get("topped_up") else ""))
    return 0
