"""`draftgym export`: a schedule in the form a serving engine reads, checked against that engine's rules.

vllm  (`--speculative-config '<json>'`; vllm/config/speculative.py, field num_speculative_tokens_per_batch_size,
      and docs/features/speculative_decoding/dynamic_speculative_decoding.md, read 2026-11-25 at commits
      002e77c1f0ef and 015a47e1282c):
        {"method": "eagle3", "model": <head>, "num_speculative_tokens": K_max,
         "num_speculative_tokens_per_batch_size": [[start_bs, end_bs, K], ...]}
      ranges inclusive, contiguous from batch 1; every K <= num_speculative_tokens (> 0); K = 0 drafts
      nothing. vLLM drafts chains only (its tree attention was removed), so a tree is not expressible.

sglang  static launch flags (python/sglang/srt/server_args.py; eagle_utils.py organize_draft_results):
        --speculative-algorithm EAGLE3 --speculative-draft-model-path <head>
        --speculative-num-steps D --speculative-eagle-topk W --speculative-num-draft-tokens V
      D = draft forwards, W = topk beams; the tree is the best V - 1 of the pool of topk scores from the
      first step plus topk^2 from each later one (W + (D - 1) W^2), verified with the root, so
      num_draft_tokens = V root included, and V - 1 <= pool. With topk = 1 the server sets V = D + 1.
      (EAGLE's own topK_genrate counts total_token without the root: it returns total_token + 1 tokens.)
      SGLang's bench script skips configs with D W + 1 < V; the server does not; the export notes them.
      One shape for every batch size: a per-B schedule is not expressible.

sglang-adaptive  the JSON of --speculative-adaptive-config (sglang_adaptive.py has the rule and its sources):
        {"strategy": "ema", "<lo_1>": {"candidate_steps": [K_1]}, "<lo_2>": {"candidate_steps": [K_2]}, ...}
      one tier per range, keyed by its lower batch bound, pinned to the schedule's chain (a single
      candidate, so the EMA never moves it); launched with --speculative-adaptive, topk 1 and
      num_steps = the largest K. Trees (topk > 1) are not expressible.

sglang-throughput  the JSON of --speculative-adaptive-config for SGLang's throughput-aware controller
      (python/sglang/srt/speculative/throughput_aware_controller.py, its docstring and
      _parse_bs_candidates; throughput_aware_spec_params.py; read 2026-11-26 at commits 088c5ab and
      2357074):
        {"strategy": "throughput_aware", "window_size": 20, "update_interval": 10,
         "<lo_1>": {"candidate_steps": [K, ...]}, ...}
      integer-string keys are tier lower bounds, each a non-empty list of positive step counts (chains,
      topk 1, num_draft_tokens = K + 1); every update_interval batches the controller picks the
      candidate with the best E[tokens | K] / cost_ms(B, K), E from a sliding window of per-position
      acceptance, cost from its own start-up profile. A tier holds the schedule's K and every chain
      whose tuned tokens/s came within NEAR_BEST of the best chain at one of the tier's tuned batch
      sizes, so the online rule chooses among the near-equals by the acceptance it sees. Off (K = 0)
      and trees are not expressible: refused, or with --best-expressible the best chain (K >= 1).

json  the schedule itself (schedule.py).

A shape an engine cannot run is refused in one line, or, with --best-expressible, replaced by the
best runnable shape of the schedule's tuning table at each tuned batch size (and the export says so).
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from pipeline.decode import step_shape
from pipeline.errors import DataError, DraftGymError
from simulator.serving.choosers.sglang_adaptive import parse_config
from simulator.serving.choosers.sglang_throughput import parse_tiers
from simulator.serving.schedule import Schedule, is_off_everywhere

HEAD_PLACEHOLDER = "<path or hub id of the EAGLE-3 head>"


@dataclass
class ExportConfig:
    """`draftgym export` settings."""
    schedule: str = ""                    # schedule JSON from `draftgym tune` (required)
    fmt: str = ""                         # vllm | sglang | sglang-adaptive | sglang-throughput | json (required)
    head: str | None = None               # EAGLE-3 head path / hub id written into the config
    best_expressible: bool = False        # replace what the engine cannot run by its best runnable shape
    max_batch: int | None = None          # vllm: the last range ends here
    out: str | None = None                # file to write (default: print)


# ------------------------------------------------------------------ the engines' rules

def check_vllm(cfg: dict) -> None:
    """vLLM's rules for a dynamic speculative_config (module docstring); DataError naming the first broken one."""
    n = cfg.get("num_speculative_tokens")
    if not isinstance(n, int) or n <= 0:
        raise DataError(f"vLLM: num_speculative_tokens must be an int > 0, got {n!r}")
    if cfg.get("method") != "eagle3" or not cfg.get("model"):
        raise DataError("vLLM: method must be 'eagle3' with the head as 'model'")
    sched = cfg.get("num_speculative_tokens_per_batch_size")
    expect = 1
    for entry in sched or []:
        if not (isinstance(entry, list) and len(entry) == 3 and all(isinstance(x, int) for x in entry)):
            raise DataError(f"vLLM: each entry is [start_bs, end_bs, K], got {entry!r}")
        lo, hi, k = entry
        if lo != expect or hi < lo:
            raise DataError(f"vLLM: ranges must be inclusive and contiguous from 1, got {sched}")
        if not 0 <= k <= n:
            raise DataError(f"vLLM: K = {k} in {entry} is outside 0..num_speculative_tokens ({n})")
        expect = hi + 1
    if not sched:
        raise DataError("vLLM: num_speculative_tokens_per_batch_size is empty")


def check_sglang_static(d: int, w: int, v: int) -> list[str]:
    """SGLang's rules for the three static flags; returns notes (rules the server does not enforce)."""
    if d < 1 or w < 1 or v < 2:
        raise DataError(f"SGLang: num_steps >= 1, topk >= 1 and num_draft_tokens >= 2, got {d}, {w}, {v}")
    if v - 1 > step_shape.pool_size(d, w):
        raise DataError(f"SGLang: num_draft_tokens - 1 = {v - 1} exceeds the draft pool of {step_shape.pool_size(d, w)}")
    if w == 1 and v != d + 1:
        raise DataError(f"SGLang: with topk = 1, num_draft_tokens must be num_steps + 1 = {d + 1}, got {v}")
    if d * w + 1 < v:
        return [f"steps x topk + 1 = {d * w + 1} < num_draft_tokens = {v}: SGLang's bench_speculative.py "
                "skips such configs; the server runs them"]
    return []


def check_sglang_adaptive(obj: dict) -> None:
    parse_config(obj, "SGLang adaptive config")


def check_sglang_throughput(obj: dict) -> None:
    """The checks SGLang's throughput-aware controller makes on its config (_parse_bs_candidates)."""
    parse_tiers(obj)


# ------------------------------------------------------------------ what each engine can run

def one_draft(shape) -> bool:
    """A depth-1 tree that verifies one draft, (1, W, 2): one draft forward, its top-1 token verified,
    which is what chain 1 runs whatever W (the other W - 1 candidates are dropped before the verify)."""
    d, _, v = step_shape.canonical(shape)
    return d == 1 and v == 2


def as_chain_one(schedule: Schedule) -> tuple[Schedule, list[str]]:
    """Each (1, W, 2) range of the schedule as chain 1 (one_draft), with a note per shape changed."""
    notes = sorted({f"{step_shape.label(s)} drafts and verifies one token, as chain 1 does: exported as chain 1"
                    for _, _, s in schedule.ranges if one_draft(s) and s != step_shape.chain(1)})
    if not notes:
        return schedule, []
    ranges = [(lo, hi, step_shape.chain(1) if one_draft(s) else s) for lo, hi, s in schedule.ranges]
    merged = Schedule.from_choices([lo for lo, _, _ in ranges], [s for _, _, s in ranges], max_batch=ranges[-1][1],
                                   tuning=schedule.tuning, meta=schedule.meta)
    return merged, notes


def expressible(schedule: Schedule, allowed, engine: str, best: bool) -> tuple[Schedule, list[str]]:
    """The schedule if every shape passes `allowed` (a one-draft tree counts as chain 1: one_draft);
    else refuse, or (best) swap each tuned B's shape for its best allowed one and merge again."""
    runs = lambda s: allowed(s) or one_draft(s)
    bad = [(lo, hi, s) for lo, hi, s in schedule.ranges if not runs(s)]
    if not bad:
        return as_chain_one(schedule)
    lo, hi, s = bad[0]
    if not best:
        raise DataError(f"{engine} cannot run {step_shape.label(s)} (batch {lo}-{hi}): {_why(engine)}; "
                        f"--best-expressible exports its best runnable shape instead")
    if not schedule.tuning:
        schedule.best_at(1, allowed)                              # raises: no tuning table
    bs = schedule.tuning["batch_sizes"]
    new = [schedule.shape_for(b) if runs(schedule.shape_for(b)) else schedule.best_at(b, runs) for b in bs]
    out = Schedule.from_choices(bs, new, max_batch=schedule.max_batch, tuning=schedule.tuning, meta=schedule.meta)
    notes = [f"batch {b}: {step_shape.label(schedule.shape_for(b))} -> {step_shape.label(n)} (best {engine} can run)"
             for b, n in zip(bs, new) if n != schedule.shape_for(b)]
    out, more = as_chain_one(out)
    return out, notes + more


def _why(engine: str) -> str:
    return {"vLLM": "vLLM drafts chains only (K tokens, no tree)",
            "SGLang adaptive": "SGLang's adaptive mode runs topk = 1 chains only",
            "SGLang throughput-aware": "its candidates are topk = 1 chains of K >= 1 steps (no tree, no off)",
            }.get(engine, "not expressible")


def drafting_chain(shape) -> bool:
    """A chain of K >= 1 drafts (what SGLang's throughput-aware controller can choose)."""
    return step_shape.is_chain(shape) and step_shape.canonical(shape)[0] > 0


def best_single(schedule: Schedule) -> tuple:
    """The one shape with the best mean of tokens/s / (best tokens/s at B) over the tuned batch sizes."""
    if not schedule.tuning:
        raise DataError("this schedule has no tuning table to pick a best single shape from (write it with `draftgym tune`)")
    tps = np.asarray(schedule.tuning["tokens_per_s"], np.float64)              # [n, A]
    score = (tps / tps.max(1, keepdims=True)).mean(0)
    shapes = [step_shape.parse(s) for s in schedule.tuning["shapes"]]
    order = np.argsort(-score)
    return next((shapes[a] for a in order if shapes[a] != step_shape.OFF), shapes[order[0]])


# ------------------------------------------------------------------ writers

def to_vllm(schedule: Schedule, head: str | None, best: bool = False, max_batch: int | None = None) -> tuple[dict, list[str]]:
    sched, notes = expressible(schedule, step_shape.is_chain, "vLLM", best)
    if is_off_everywhere(sched):
        raise DataError("the schedule never speculates: run vLLM without a speculative_config")
    ranges = [[lo, hi, step_shape.chain_k(s)] for lo, hi, s in sched.ranges]
    if max_batch is not None:
        if max_batch < ranges[-1][0]:
            raise DraftGymError(f"--max-batch {max_batch} is below the last range's start {ranges[-1][0]}")
        ranges[-1][1] = max_batch
    cfg = {"method": "eagle3", "model": head or HEAD_PLACEHOLDER,
           "num_speculative_tokens": max(k for _, _, k in ranges), "num_speculative_tokens_per_batch_size": ranges}
    check_vllm(cfg)
    return cfg, notes


def to_sglang_static(schedule: Schedule, head: str | None, best: bool = False) -> tuple[list[str], list[str]]:
    shapes = schedule.shapes()
    notes = []
    if len(shapes) > 1:
        if not best:
            raise DataError(f"SGLang's static flags hold one shape at every batch size; this schedule has "
                            f"{len(shapes)} ({', '.join(step_shape.label(s) for s in shapes)}): use --format sglang-adaptive "
                            f"(chains) or --best-expressible for the best single shape")
        shape = best_single(schedule)
        notes.append(f"one shape for every batch size: {step_shape.label(shape)} (best mean tokens/s relative to each tuned B's best)")
    else:
        shape = shapes[0]
    if shape == step_shape.OFF:
        raise DataError("the schedule never speculates: launch SGLang without --speculative-* flags")
    d, w, v = shape
    notes += check_sglang_static(d, w, v)
    flags = ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", head or HEAD_PLACEHOLDER,
             "--speculative-num-steps", str(d), "--speculative-eagle-topk", str(w), "--speculative-num-draft-tokens", str(v)]
    return flags, notes


def to_sglang_adaptive(schedule: Schedule, head: str | None, best: bool = False,
                       config_path: str = "adaptive.json") -> tuple[dict, list[str], list[str]]:
    sched, notes = expressible(schedule, step_shape.is_chain, "SGLang adaptive", best)
    if is_off_everywhere(sched):
        raise DataError("the schedule never speculates: launch SGLang without --speculative-* flags")
    obj = {"strategy": "ema", **{str(lo): {"candidate_steps": [step_shape.chain_k(s)]} for lo, _, s in sched.ranges}}
    check_sglang_adaptive(obj)
    k = max(step_shape.chain_k(s) for _, _, s in sched.ranges)
    flags = ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", head or HEAD_PLACEHOLDER,
             "--speculative-num-steps", str(k), "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens",
             str(k + 1), "--speculative-adaptive", "--speculative-adaptive-config", config_path]
    return obj, flags, notes


NEAR_BEST = 0.95     # sglang-throughput: chains within this share of the best chain's tuned tokens/s join a tier


def _near_best_chains(schedule: Schedule, lo: int, hi: int | None) -> set[int]:
    """K of every drafting chain within NEAR_BEST of the best one at some tuned B in [lo, hi]."""
    t = schedule.tuning
    if not t:
        return set()
    shapes = [step_shape.parse(x) for x in t["shapes"]]
    chains = [(a, step_shape.chain_k(sh)) for a, sh in enumerate(shapes) if drafting_chain(sh)]
    ks = set()
    for b, row in zip(t["batch_sizes"], np.asarray(t["tokens_per_s"], np.float64)):
        if chains and b >= lo and (hi is None or b <= hi):
            best = max(row[a] for a, _ in chains)
            ks |= {k for a, k in chains if row[a] >= NEAR_BEST * best}
    return ks


def to_sglang_throughput(schedule: Schedule, head: str | None, best: bool = False,
                         config_path: str = "throughput.json") -> tuple[dict, list[str], list[str]]:
    if is_off_everywhere(schedule):
        raise DataError("the schedule never speculates: launch SGLang without --speculative-* flags")
    sched, notes = expressible(schedule, drafting_chain, "SGLang throughput-aware", best)
    tiers = {}
    for lo, hi, s in sched.ranges:
        tiers[str(lo)] = {"candidate_steps": sorted({step_shape.chain_k(s)} | _near_best_chains(schedule, lo, hi))}
    obj = {"strategy": "throughput_aware", "window_size": 20, "update_interval": 10, **tiers}
    check_sglang_throughput(obj)
    k = max(max(t["candidate_steps"]) for t in tiers.values())
    flags = ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", head or HEAD_PLACEHOLDER,
             "--speculative-num-steps", str(k), "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens",
             str(k + 1), "--speculative-adaptive", "--speculative-adaptive-config", config_path]
    return obj, flags, notes


def export(cfg: ExportConfig) -> tuple[str, list[str]]:
    """(the text to write, notes)."""
    sched = Schedule.load(cfg.schedule)
    if cfg.head == "default":                     # the shipped head: an engine needs its directory, not our alias
        from pipeline.models.head import resolve_head_dir
        cfg = replace(cfg, head=str(resolve_head_dir("default")))
    if cfg.fmt == "json":
        return sched.dumps(), []
    if cfg.fmt == "vllm":
        obj, notes = to_vllm(sched, cfg.head, cfg.best_expressible, cfg.max_batch)
        return json.dumps(obj) + "\n", notes + ["launch: vllm serve <target> --speculative-config '<this JSON>'"]
    if cfg.fmt == "sglang":
        flags, notes = to_sglang_static(sched, cfg.head, cfg.best_expressible)
        return " ".join(flags) + "\n", notes
    if cfg.fmt == "sglang-adaptive":
        obj, flags, notes = to_sglang_adaptive(sched, cfg.head, cfg.best_expressible, cfg.out or "adaptive.json")
        return json.dumps(obj, indent=1) + "\n", notes + ["launch: python -m sglang.launch_server --model-path <target> "
                                                          + " ".join(flags)]
    if cfg.fmt == "sglang-throughput":
        obj, flags, notes = to_sglang_throughput(sched, cfg.head, cfg.best_expressible, cfg.out or "throughput.json")
        return json.dumps(obj, indent=1) + "\n", notes + ["launch: python -m sglang.launch_server --model-path "
                                                          "<target> " + " ".join(flags)]
    raise DraftGymError(f"unknown export format {cfg.fmt!r} (vllm | sglang | sglang-adaptive | sglang-throughput | json)")


def run_export_command(cfg: ExportConfig) -> int:
    text, notes = export(cfg)
    if cfg.out:
        Path(cfg.out).parent.mkdir(parents=True, exist_ok=True)
        Path(cfg.out).write_text(text)
        print(f"wrote {cfg.out} ({cfg.fmt})")
    else:
        print(text, end="")
    for n in notes:                         # beside a printed config, on stderr: stdout stays the config alone
        print(n, file=sys.stdout if cfg.out else sys.stderr)
    return 0
