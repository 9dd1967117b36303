"""Engine benchmark: AR vs EAGLE-3 on MT-bench first turns, plus per-op times.

    python -m tools.bench.engine --head random --n-prompts 10 --max-new-tokens 128 --out data/reports/bench_engine.json

Both methods run in the same process on the same prompts (greedy), one after the other per prompt,
and their outputs are checked for equality. tokens/s per prompt = new tokens / wall time (prefill
included); the table reports the mean over prompts, and the speedup as the ratio of those means.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from pipeline.decode.controller import StaticController
from pipeline.datasets import load_prompts
from pipeline.decode.engine.single import Engine
from pipeline.runtime.fingerprint import environment_fingerprint
from pipeline.models.head import load_head_for
from pipeline.profiling.timed_ops import draft_op, time_op, verify_op
from pipeline.models.target import encode_prompt, load_target


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--head", default="random")
    ap.add_argument("--dataset", default="mt-bench")
    ap.add_argument("--split", default=None, help="train | val | test (default: the file's first prompts)")
    ap.add_argument("--n-prompts", type=int, default=10)
    ap.add_argument("--skip-ops", action="store_true", help="skip the per-op timings")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--configs", default="8,10,60", help="semicolon-separated D,W,V triples")
    ap.add_argument("--op-context", type=int, default=256, help="context length for the per-op timings")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                    help="compute dtype (default: bf16 on a GPU, pipeline.models.target.default_cpu_dtype on a CPU)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    target = load_target(args.model, device="cpu" if not torch.cuda.is_available() else None, dtype=args.dtype)
    head = load_head_for(args.head, target.model)
    eng = Engine(target.model, head, target.eos_token_ids)
    dev = target.device
    prompts = load_prompts(args.dataset, split=args.split, n=args.n_prompts)
    configs = [tuple(int(x) for x in c.split(",")) for c in args.configs.split(";")]
    report = {"command": " ".join(["python -m tools.bench.engine"] + (argv or sys.argv[1:])),
              "date": time.strftime("%Y-%m-%d"), "environment": environment_fingerprint(dev, target.dtype),
              "model": args.model, "head": head.head_id, "dataset": args.dataset, "n_prompts": len(prompts),
              "max_new_tokens": args.max_new_tokens}

    # per-op times
    ops = {}
    if not args.skip_ops:
        ops["draft_forward_W10"] = time_op(draft_op(head, 10, args.op_context), dev, repeats=args.repeats)
        for V in (1, 16, 60, 240):
            ops[f"verify_V{V}"] = time_op(verify_op(target.model, V, args.op_context), dev, repeats=args.repeats)
    report["ops_context_len"] = args.op_context
    report["ops"] = ops

    # end to end, warm-up first
    warm = encode_prompt(target.tokenizer, "Hello!")
    eng.generate_ar(warm, 8)
    eng.generate(warm, 8)
    rows = {"ar": []} | {f"eagle3 D={D} W={W} V={V}": [] for D, W, V in configs}
    lossless = True
    for rec in tqdm(prompts, desc="prompts"):
        ids = encode_prompt(target.tokenizer, list(rec.messages))
        ar = eng.generate_ar(ids, args.max_new_tokens)
        rows["ar"].append({"tokens_per_s": ar.tokens_per_s, "tau": 1.0, "new_tokens": ar.new_tokens})
        for D, W, V in configs:
            sp = eng.generate(ids, args.max_new_tokens, controller=StaticController(D, W, V))
            lossless &= sp.output_ids == ar.output_ids
            c = sp.cycles
            rows[f"eagle3 D={D} W={W} V={V}"].append({
                "tokens_per_s": sp.tokens_per_s, "tau": sp.tau, "new_tokens": sp.new_tokens,
                "t_draft": sum(x.t_draft for x in c) / len(c), "t_verify": sum(x.t_verify for x in c) / len(c),
                "accepted": [x.accepted for x in c]})
    ar_tps = statistics.mean(r["tokens_per_s"] for r in rows["ar"])
    summary = {}
    for name, rs in rows.items():
        tps = [r["tokens_per_s"] for r in rs]
        summary[name] = {"tokens_per_s": statistics.mean(tps), "tokens_per_s_std": statistics.pstdev(tps),
                         "tau": statistics.mean(r["tau"] for r in rs), "speedup_vs_ar": statistics.mean(tps) / ar_tps,
                         "new_tokens": sum(r["new_tokens"] for r in rs)}
        if name != "ar":
            # vLLM's per-position acceptance rate: cycles whose draft token i was accepted / cycles
            acc = [a for r in rs for a in r["accepted"]]
            summary[name]["acceptance_rate_by_position"] = [sum(a >= i for a in acc) / len(acc) for i in range(1, 9)]
            summary[name]["t_draft_per_cycle"] = statistics.mean(r["t_draft"] for r in rs)
            summary[name]["t_verify_per_cycle"] = statistics.mean(r["t_verify"] for r in rs)
    report["summary"], report["lossless"] = summary, lossless
    txt = json.dumps(report, indent=2)
    print(txt)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(txt + "\n")
    return 0 if lossless else 1


if __name__ == "__main__":
    sys.exit(main())
