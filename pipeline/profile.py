"""`draftgym profile`: latency profile of this device for one target + head -> `latency` Parquet rows.

Ops (design.md):
  draft_step  one head forward over W beams, per (W, context_len)
  verify      the verify phase over V tree tokens (target forward with hidden states, acceptance,
              KV compaction, feature fusion), per (V, context_len); V = 1 is also the AR step
  policy      one forward of a small MLP policy at batch 1 (LTD-sized); learned policies add their own
              rows with `draftgym profile-policy`
  overhead    per-cycle engine cost outside draft/verify/controller, from real static-default cycles

Method (default, "in situ"): the engine decodes with static trees (D, W, V), D the smallest depth
whose pool holds V - 1 nodes, from prompts of exactly `context_len` tokens, after one warm-up
generation; every cycle's synchronised t_verify is one sample of verify(V, context_len) and
t_draft / D one sample of draft_step(W, context_len) (context_len = the prompt length: the
generation adds at most `--cycle-tokens` to it). Statistics: n, median, p10, p90, mean.
Why in situ: on a CPU the same forward timed in a tight loop (`--isolated`, hot caches, no draft
work in between) ran 13-15 % faster than inside real decoding, and the simulator then overrated
every method by that much (BENCHMARKS.md, E). `--isolated` keeps the tight-loop micro-benchmarks
(pipeline.latency) as ops `verify_isolated` / `draft_isolated`, for comparison.
Profile alone: never while collection actors or other jobs share the device.
"""
from __future__ import annotations

import json
import time
import uuid

import numpy as np
import pyarrow as pa
import torch
from tqdm import tqdm

from pipeline.errors import DraftGymError
from pipeline.latency import draft_op, time_op, verify_op
from pipeline.schema import LATENCY, SCHEMA_VERSION, partition_dir, write_atomic

DEFAULT_VERIFY_SIZES = (1, 2, 4, 8, 16, 32, 60, 100, 160, 240)
DEFAULT_CONTEXTS = (32, 128, 512)


def policy_op(obs_dim: int = 102, hidden: int = 64, device="cpu"):
    """A stand-in policy of LTD's size (obs -> 64 -> 64 -> 2, tanh) at batch 1."""
    net = torch.nn.Sequential(torch.nn.Linear(obs_dim, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, hidden),
                              torch.nn.Tanh(), torch.nn.Linear(hidden, 2)).to(device)
    x = torch.randn(1, obs_dim, device=device)

    def run():
        with torch.inference_mode():
            net(x).argmax(-1).item()
    return run


def measure_overhead(engine, tokenizer, n_tokens: int = 48) -> list[float]:
    """Per-cycle time not spent in draft, verify or controller, from a real static-default decode."""
    from pipeline.target import encode_prompt

    ids = encode_prompt(tokenizer, "Explain how a hash map works, step by step.")
    engine.generate(ids, 8)
    res = engine.generate(ids, n_tokens)
    return [max(0.0, c.t_cycle - c.t_draft - c.t_verify - c.t_controller) for c in res.cycles]


def depth_for(V: int, W: int, max_depth: int = 12) -> int:
    """Smallest D whose pool (W + (D-1) W^2 candidates) fills a V-node tree (root + V - 1)."""
    D = 1
    while D < max_depth and W + (D - 1) * W * W < V - 1:
        D += 1
    return D


def stats_of(samples) -> dict:
    """LATENCY statistics of timing samples (seconds): n, median, p10, p90, mean."""
    s = np.asarray(samples, np.float64)
    return {"n": int(s.size), "median": float(np.median(s)), "p10": float(np.quantile(s, 0.1)),
            "p90": float(np.quantile(s, 0.9)), "mean": float(s.mean())}


def in_situ_samples(engine, tokenizer, context_len: int, depth: int, width: int, verify_size: int,
                    cycle_tokens: int, min_cycles: int = 8) -> list:
    """CycleRecords of greedy static (D, W, V) decoding from prompts of exactly `context_len` tokens
    (after a warm-up generation). A prompt whose greedy answer ends at once (EOS) gives no cycles, so
    up to 8 prompt variants are tried until `min_cycles` cycles are in."""
    from pipeline.controller import StaticController

    ctrl = StaticController(depth, width, verify_size)
    cycles, warm = [], False
    for variant in range(8):
        ids = context_prompt(tokenizer, context_len, variant)
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
    from pipeline.target import encode_prompt

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
                cycle_tokens: int = 24) -> dict:
    """Load the target and head, then `profile_engine`."""
    from pipeline.engine import Engine
    from pipeline.generate import load_head_for
    from pipeline.target import load_target

    target = load_target(model, device=device, dtype=dtype)
    head = load_head_for(head_spec, target.model)
    engine = Engine(target.model, head, target.eos_token_ids)
    return profile_engine(engine, target.tokenizer, model, out, widths=widths, verify_sizes=verify_sizes,
                          contexts=contexts, repeats=repeats, warmup=warmup, progress=progress, isolated=isolated,
                          cycle_tokens=cycle_tokens)


def profile_engine(engine, tokenizer, model: str, out: str, widths=(10,), verify_sizes=DEFAULT_VERIFY_SIZES,
                   contexts=DEFAULT_CONTEXTS, repeats: int = 5, warmup: int = 2, progress: bool = True,
                   isolated: bool = False, cycle_tokens: int = 24) -> dict:
    """Profile a loaded engine (its target and head) into a new `latency` file under `out`.
    `draftgym validate --profile-first` calls this with the engine it is about to validate on."""
    from pipeline.fingerprint import device_name, environment_fingerprint

    target_model, head = engine.model, engine.head
    dev = engine.device
    env = environment_fingerprint(dev)
    max_ctx = target_model.config.max_position_embeddings - max(verify_sizes) - cycle_tokens - 1
    contexts = [c for c in contexts if c <= max_ctx]
    if not contexts:
        raise DraftGymError(f"no profiling context length fits the target's {max_ctx} positions")
    profile_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    rows = []

    def add(op, stats, width=0, verify_size=0, context_len=0):
        rows.append({"schema_version": SCHEMA_VERSION, "profile_id": profile_id, "device": device_name(dev),
                     "device_type": dev.type, "model_id": model, "head_id": head.head_id,
                     "dtype": str(next(target_model.parameters()).dtype).removeprefix("torch."), "op": op,
                     "width": width, "verify_size": verify_size, "context_len": context_len, "batch": 1,
                     "n": stats["n"], "median": stats["median"], "p10": stats["p10"], "p90": stats["p90"],
                     "mean": stats["mean"], "env_json": json.dumps(env)})

    if isolated:
        jobs = [("draft_isolated", W, 0, c) for W in widths for c in contexts] + \
               [("verify_isolated", 0, V, c) for V in verify_sizes for c in contexts]
        for op, W, V, c in tqdm(jobs, desc="profile (isolated)", unit="op", disable=not progress):
            fn = draft_op(head, W, c) if op == "draft_isolated" else verify_op(target_model, V, c, head=head)
            add(op, time_op(fn, dev, warmup=warmup, repeats=repeats), width=W, verify_size=V, context_len=c)
    # in situ: real static-tree cycles. verify per (V, c) with the first width; draft per (W, c),
    # pooled over those trees (and, for further widths, over one 2-level tree each)
    W0 = widths[0]
    jobs = [(W0, V, c, True) for c in contexts for V in verify_sizes] + \
           [(W, min(1 + W, max(verify_sizes)), c, False) for W in widths[1:] for c in contexts]
    drafts: dict[tuple[int, int], list[float]] = {}
    for W, V, c, timed_verify in tqdm(jobs, desc="profile", unit="tree", disable=not progress):
        D = depth_for(V, W) if timed_verify else 2
        cyc = in_situ_samples(engine, tokenizer, c, D, W, V, cycle_tokens, min_cycles=max(repeats, 8))
        cyc = [x for x in cyc if x.verify_size == min(V, 1 + W + (D - 1) * W * W)]
        if not cyc:
            raise DraftGymError(f"profile: no cycles of the static tree ({D}, {W}, {V}) at context {c}")
        if timed_verify:
            add("verify", stats_of([x.t_verify for x in cyc]), verify_size=V, context_len=c)
        drafts.setdefault((W, c), []).extend(x.t_draft / x.depth for x in cyc)
    for (W, c), ts in drafts.items():
        add("draft_step", stats_of(ts), width=W, context_len=c)
    add("policy", time_op(policy_op(device=dev), dev, warmup=5, repeats=50))
    add("overhead", stats_of(measure_overhead(engine, tokenizer)), width=10, verify_size=60)
    path = partition_dir(out, "latency", model, "_profile", 0.0).parent.parent / f"{profile_id}.parquet"
    write_atomic(pa.Table.from_pylist(rows, schema=LATENCY), path, "latency")
    return {"profile_id": profile_id, "device": device_name(dev), "rows": len(rows), "path": str(path)}


def add_profile(sub) -> None:
    p = sub.add_parser("profile", help="measure draft/verify/policy/overhead latency on this device")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--head", default="default")
    p.add_argument("--widths", default="10")
    p.add_argument("--verify-sizes", default=",".join(map(str, DEFAULT_VERIFY_SIZES)))
    p.add_argument("--contexts", default=",".join(map(str, DEFAULT_CONTEXTS)))
    p.add_argument("--repeats", type=int, default=5, help="at least this many cycles (in situ) or timed calls (isolated)")
    p.add_argument("--cycle-tokens", type=int, default=24, help="in situ: new tokens per profiling generation")
    p.add_argument("--isolated", action="store_true",
                   help="also time the bare ops in a tight loop (ops verify_isolated / draft_isolated)")
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default=None)
    p.add_argument("--out", default="data/logs")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_run_profile_cli)


def _run_profile_cli(args) -> int:
    from pipeline.cli import parse_positive_ints

    if args.head not in ("random", "default"):
        from pipeline.head import resolve_head_dir
        resolve_head_dir(args.head)
    r = run_profile(args.model, args.head, args.out, widths=parse_positive_ints(args.widths, "--widths"),
                    verify_sizes=parse_positive_ints(args.verify_sizes, "--verify-sizes"),
                    contexts=parse_positive_ints(args.contexts, "--contexts"),
                    repeats=args.repeats, device=args.device, dtype=args.dtype, isolated=args.isolated,
                    cycle_tokens=args.cycle_tokens)
    print(json.dumps(r) if args.json else f"profiled {r['rows']} ops on {r['device']} -> {r['path']}")
    return 0
