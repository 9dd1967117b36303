"""Batched decoding benchmark: tokens/s against batch size B for AR and static EAGLE-3 shapes.

    python -m tools.bench.batch --dataset sharegpt --split test --n-prompts 32 --max-new-tokens 128 \\
        --batch-sizes 1,2,4,8,16,32 --grid-best D,W,V --dtypes float32,bfloat16 --out data/reports/bench_batch.json

Run it on a quiet machine: every figure is a timing. Per dtype, on the first N held-out prompts of at
most --max-prompt-tokens tokens, the batched engine (pipeline/decode/engine/core.py) decodes all N
prompts at each B (continuous batching: a finished row's slot takes the next prompt), greedy, with

    AR (every step off), chains K = --chains, trees --trees, and --grid-best (this machine's batch-1 best)

methods interleaved within each B. Figures:

  tokens/s           all new tokens / the call's wall time (prefills and the drain included)
  x AR               tokens/s / AR's at the same B
  best static at B   the shape with the most tokens/s at B; "off beats every speculation from B":
                     the smallest measured B from which on AR has more tokens/s than every shape
  verify cost        mean t_verify of the steps by (rows in the step, V), against rows x V tokens
  draft step         mean t_draft / D of the drafting steps by (rows, W), against rows x W beams
                     (t_draft holds the pending-entry forward and the tree selection too)
  HF generate        batched AR against transformers' `generate` (greedy, left-padded, the same
                     packed model) on the first --hf-batch prompts at B = --hf-batch
  same as AR         rows whose output equals AR's at the same B (fp32: all of them)

Printed: Markdown tables naming the CPU model and the dtype; written (--out): the JSON. --dry-run
prints the plan (methods, batch sizes, generations) without loading a model.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict

from pipeline.cliargs import DefaultsHelpFormatter, parse_positive_ints
from pipeline.errors import DraftGymError
from pipeline.runtime.atomic import atomic_write_json

AR = "ar"
TREES = "2,10,10;3,10,20;8,10,60"


def method_shapes(args) -> dict[str, tuple[int, int, int]]:
    """{name: (D, W, V)}: ar (0, 1, 1), chain:K (K, 1, K + 1), tree:D,W,V, grid-best."""
    out = {AR: (0, 1, 1)}
    out.update({f"chain:{k}": (k, 1, k + 1) for k in parse_positive_ints(args.chains, "--chains")} if args.chains else {})
    for t in [t for t in args.trees.split(";") if t.strip()]:
        d = parse_positive_ints(t, "--trees")
        if len(d) != 3:
            raise DraftGymError(f"--trees takes D,W,V triples separated by ';', got {t!r}")
        out[f"tree:{','.join(map(str, d))}"] = d
    if args.grid_best:
        d = parse_positive_ints(args.grid_best, "--grid-best")
        if len(d) != 3:
            raise DraftGymError(f"--grid-best takes one D,W,V, got {args.grid_best!r}")
        out[f"grid-best tree:{','.join(map(str, d))}"] = d
    return out


def select_prompts(args, tokenizer) -> list[tuple[str, list[int]]]:
    """[(prompt_id, ids)]: the first N prompts of the split with <= --max-prompt-tokens tokens."""
    from pipeline.datasets import load_prompts
    from pipeline.models.target import encode_prompt

    out = []
    for r in load_prompts(args.dataset, split=args.split):
        ids = encode_prompt(tokenizer, list(r.messages))
        if len(ids) <= args.max_prompt_tokens:
            out.append((r.prompt_id, ids))
            if len(out) == args.n_prompts:
                return out
    raise DraftGymError(f"only {len(out)} prompts of {args.dataset} {args.split} have <= {args.max_prompt_tokens} "
                        f"tokens; --n-prompts {args.n_prompts} asked")


# ---------------------------------------------------------------------------------- one generation

def run_method(engine, name: str, shape, prompts, max_new: int, B: int):
    from pipeline.decode.controller import StaticController
    from pipeline.decode.step_shape import StepShape

    if name == AR:
        return engine.generate_ar(prompts, max_new, batch_size=B)
    return engine.generate(prompts, max_new, batch_size=B, controller=StaticController(StepShape(*shape)))


def figures(res, ar_outputs) -> dict:
    """What one batched generation contributes to the report."""
    row_steps = sum(s.batch_size for s in res.steps)
    held = [s for s in res.steps if s.batch_size == res.steps[0].batch_size] if res.steps else []
    out = {"tokens_per_s": res.tokens_per_s, "new_tokens": res.new_tokens, "wall_s": res.wall_s,
           "prefill_s": res.prefill_s, "steps": len(res.steps),
           "tau": sum(s.emitted_sum for s in res.steps) / row_steps if row_steps else None,
           "full_batch_decode_tokens_per_s": (sum(s.emitted_sum for s in held) / sum(s.t_step for s in held)
                                              if held and sum(s.t_step for s in held) > 0 else None)}
    if ar_outputs is not None:
        out["same_as_ar"] = sum(r.output_ids == a for r, a in zip(res, ar_outputs))
    return out


def op_costs(steps) -> tuple[list[dict], list[dict]]:
    """(verify cost by (rows, V), draft step by (rows, W)): means over the steps, in ms."""
    verify, draft = defaultdict(list), defaultdict(list)
    for s in steps:
        verify[(s.batch_size, s.verify_size)].append(s.t_verify)
        if s.depth:
            draft[(s.batch_size, s.width)].append(s.t_draft / s.depth)
    v = [{"rows": b, "verify_size": V, "tokens": b * V, "t_verify_ms": 1e3 * statistics.mean(t), "steps": len(t)}
         for (b, V), t in sorted(verify.items())]
    d = [{"rows": b, "width": W, "beams": b * W, "t_draft_step_ms": 1e3 * statistics.mean(t), "steps": len(t)}
         for (b, W), t in sorted(draft.items())]
    return v, d


# ---------------------------------------------------------------------------------- comparisons

def hf_generate(model, tokenizer, prompts: list[list[int]], max_new: int, eos: set[int]) -> dict:
    """transformers' greedy `generate` on left-padded prompts: new tokens (each row cut after its
    first EOS) / wall."""
    import torch

    dev = next(model.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (min(eos) if eos else 0)
    L = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (L - len(p)) + p for p in prompts], device=dev)
    mask = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in prompts], device=dev)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new, do_sample=False,
                             eos_token_id=sorted(eos) or None, pad_token_id=pad)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    tokens = 0
    for row in out[:, L:].tolist():
        k = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
        tokens += k
    return {"tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall if wall > 0 else 0.0}


def best_and_crossover(tps: dict[str, dict[int, float]], batch_sizes) -> tuple[dict, int | None]:
    """({B: the best static shape}, the smallest B from which AR beats every shape, or None)."""
    spec = [n for n in tps if n != AR]
    best = {B: max(spec, key=lambda n: tps[n][B]) for B in batch_sizes} if spec else {}
    beats = [B for B in batch_sizes if spec and tps[AR][B] > max(tps[n][B] for n in spec)]
    cross = next((B for B in batch_sizes if all(b in beats for b in batch_sizes if b >= B)), None)
    return best, cross


# ---------------------------------------------------------------------------------- one dtype

def run_dtype(args, dtype: str, methods: dict, batch_sizes) -> dict:
    from pipeline.decode.engine.core import BatchEngine
    from pipeline.models.head import load_head_for
    from pipeline.models.target import load_target
    from pipeline.runtime.fingerprint import environment_fingerprint

    target = load_target(args.model, dtype=dtype)
    head = load_head_for(args.head, target.model)
    beng = BatchEngine(target.model, head, target.eos_token_ids)
    chosen = select_prompts(args, target.tokenizer)
    prompts = [ids for _, ids in chosen]
    for name, shape in methods.items():                                       # warm-up, untimed
        run_method(beng, name, shape, prompts[:2], 8, 2)
    run = {"dtype": dtype, "environment": environment_fingerprint(target.device, dtype), "head": head.head_id,
           "prompts": [pid for pid, _ in chosen], "by_method": {n: {} for n in methods}}
    steps = []
    for B in batch_sizes:
        ar_out = None
        for name, shape in methods.items():
            res = run_method(beng, name, shape, prompts, args.max_new_tokens, B)
            run["by_method"][name][str(B)] = figures(res, ar_out)
            if name == AR:
                ar_out = [r.output_ids for r in res]
            steps += res.steps
        print(f"[{dtype}] B = {B}: " + ", ".join(f"{n} {run['by_method'][n][str(B)]['tokens_per_s']:.1f}"
                                                  for n in methods), file=sys.stderr, flush=True)
    tps = {n: {B: run["by_method"][n][str(B)]["tokens_per_s"] for B in batch_sizes} for n in methods}
    best, cross = best_and_crossover(tps, batch_sizes)
    run["best_static"] = {str(B): n for B, n in best.items()}
    run["off_beats_every_speculation_from"] = cross
    run["verify_cost"], run["draft_step"] = op_costs(steps)
    if args.hf_batch:
        sub = prompts[: args.hf_batch]
        hf_generate(target.model, target.tokenizer, sub[:2], 4, set(target.eos_token_ids))          # warm-up
        ours = beng.generate_ar(sub, args.max_new_tokens, batch_size=args.hf_batch)
        hf = hf_generate(target.model, target.tokenizer, sub, args.max_new_tokens, set(target.eos_token_ids))
        run["hf_generate"] = {"batch": len(sub), "batch_engine_ar_tokens_per_s": ours.tokens_per_s,
                              "hf_generate_tokens_per_s": hf["tokens_per_s"], "hf_tokens": hf["tokens"],
                              "ratio": ours.tokens_per_s / hf["tokens_per_s"] if hf["tokens_per_s"] else None}
    return run


# ---------------------------------------------------------------------------------- tables

def tables(report: dict) -> str:
    out = []
    for run in report["runs"]:
        env, dt = run["environment"], run["dtype"]
        where = f"{env.get('cpu_model') or env['device']}, {dt}"
        bs = report["config"]["batch_sizes"]
        ar = run["by_method"][AR]
        out += [f"### tokens/s against B ({where}; x AR at the same B)", "",
                "| method | " + " | ".join(f"B = {B}" for B in bs) + " |", "|---" * (len(bs) + 1) + "|"]
        for name, by in run["by_method"].items():
            cells = [f"{by[str(B)]['tokens_per_s']:.1f} ({by[str(B)]['tokens_per_s'] / ar[str(B)]['tokens_per_s']:.2f}x)"
                     for B in bs]
            out.append(f"| {name} | " + " | ".join(cells) + " |")
        cross = run["off_beats_every_speculation_from"]
        out += ["", "| B | " + " | ".join(map(str, bs)) + " |", "|---" * (len(bs) + 1) + "|",
                "| best static shape | " + " | ".join(run["best_static"].get(str(B), "-") for B in bs) + " |", "",
                f"off (AR) beats every speculation from B = {cross}" if cross else
                "off (AR) does not beat every speculation at any measured B", ""]
        out += [f"### verify cost against rows x V ({where})", "", "| rows | V | rows x V | t_verify ms | steps |",
                "|---|---|---|---|---|"]
        out += [f"| {v['rows']} | {v['verify_size']} | {v['tokens']} | {v['t_verify_ms']:.2f} | {v['steps']} |"
                for v in run["verify_cost"]]
        out += ["", f"### draft step against rows x W ({where})", "", "| rows | W | rows x W | t_draft / D ms | steps |",
                "|---|---|---|---|---|"]
        out += [f"| {d['rows']} | {d['width']} | {d['beams']} | {d['t_draft_step_ms']:.2f} | {d['steps']} |"
                for d in run["draft_step"]]
        if run.get("hf_generate"):
            h = run["hf_generate"]
            out += ["", f"batched AR at B = {h['batch']}: {h['batch_engine_ar_tokens_per_s']:.1f} tokens/s against HF "
                        f"generate {h['hf_generate_tokens_per_s']:.1f} ({h['ratio']:.2f}x) ({where})"]
        out.append("")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.bench.batch", description=__doc__.splitlines()[0],
                                 formatter_class=DefaultsHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m", help="target model id or path")
    ap.add_argument("--head", default="default", help="draft head ('default', 'random' or a path)")
    ap.add_argument("--dataset", default="sharegpt", help="built-in prompt set or a file")
    ap.add_argument("--split", default="test", help="split of the prompt set (held out from the head's training)")
    ap.add_argument("--n-prompts", type=int, default=32, help="N prompts, all decoded at every B")
    ap.add_argument("--max-prompt-tokens", type=int, default=256, help="only prompts of at most this many tokens")
    ap.add_argument("--max-new-tokens", type=int, default=128, help="new tokens per prompt")
    ap.add_argument("--batch-sizes", default="1,2,4,8,16,32", help="comma-separated batch sizes B")
    ap.add_argument("--chains", default="1,2,3,4", help="comma-separated chain lengths K ('' for none)")
    ap.add_argument("--trees", default=TREES, help="semicolon-separated D,W,V trees ('' for none)")
    ap.add_argument("--grid-best", default=None, help="this machine's batch-1 grid-best D,W,V, one more method "
                                                      "(default: none)")
    ap.add_argument("--dtypes", default=None, help="comma-separated dtypes, each measured in turn (default: the "
                                                   "device's default, pipeline.models.target.resolve_dtype_name)")
    ap.add_argument("--hf-batch", type=int, default=16, help="B of the batched-AR against HF generate comparison "
                                                            "(0: skip)")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and exit (no model loads)")
    ap.add_argument("--out", default=None, help="write the JSON report here (default: print only)")
    args = ap.parse_args(argv)
    try:
        methods = method_shapes(args)
        batch_sizes = parse_positive_ints(args.batch_sizes, "--batch-sizes")
        if args.hf_batch > args.n_prompts:
            raise DraftGymError(f"--hf-batch {args.hf_batch} needs at least as many --n-prompts ({args.n_prompts})")
    except DraftGymError as e:
        print(f"bench batch: error: {e}", file=sys.stderr)
        return 2
    from pipeline.models.target import resolve_dtype_name

    dtypes = [resolve_dtype_name(d) for d in args.dtypes.split(",")] if args.dtypes else [resolve_dtype_name(None)]
    config = {"model": args.model, "head": args.head, "dataset": args.dataset, "split": args.split,
              "n_prompts": args.n_prompts, "max_new_tokens": args.max_new_tokens, "batch_sizes": list(batch_sizes),
              "methods": {n: list(s) for n, s in methods.items()}, "dtypes": dtypes, "hf_batch": args.hf_batch}
    report = {"command": "python -m tools.bench.batch " + " ".join(argv if argv is not None else sys.argv[1:]),
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "config": config,
              "generations": len(dtypes) * len(batch_sizes) * len(methods), "runs": []}
    if args.dry_run:
        print(json.dumps(report, indent=2))
        return 0
    for dt in dtypes:
        report["runs"].append(run_dtype(args, dt, methods, batch_sizes))
    report["tables"] = tables(report)
    print(report["tables"])
    if args.out:
        atomic_write_json(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
