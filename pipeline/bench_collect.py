"""Collection benchmark (issue C): positions logged per second vs positions per second of online
EAGLE-3 decoding at the static default, same machine, same prompts, same run; bytes per row.

    python -m pipeline.bench_collect --head default --dataset mt-bench --n-prompts 5 --out data/reports/bench_collect.json

A "position" is one root of a cycle: collection logs every position of the continuation (for all
max_depth x V-grid static trees at once); online decoding visits one position per emitted token.
So the ratio says how much faster the logs of a prompt are made than decoding it once.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from pipeline.collect import CollectConfig
from pipeline.collect_job import run_collect
from pipeline.controller import StaticController
from pipeline.datasets import load_prompts
from pipeline.engine import Engine
from pipeline.fingerprint import dtype_name, environment_fingerprint
from pipeline.generate import load_head_for
from pipeline.schema import read_table, table_files
from pipeline.target import encode_prompt, load_target


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--head", default="default")
    ap.add_argument("--dataset", default="mt-bench")
    ap.add_argument("--split", default="test")
    ap.add_argument("--n-prompts", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--use-ray", action="store_true", help="collect through the Ray job (adds start-up time)")
    ap.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                    help="compute dtype (default: bf16 on a GPU, pipeline.target.default_cpu_dtype on a CPU)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="draftgym-bench-collect-"))
    try:
        # online EAGLE-3 at the static default on the same prompts (model loaded once, warm-up first)
        target = load_target(args.model, dtype=args.dtype)
        cfg = CollectConfig(model=args.model, head=args.head, dataset=args.dataset, split=args.split,
                            n_prompts=args.n_prompts, max_new_tokens=args.max_new_tokens,
                            dtype=dtype_name(target.dtype))
        head = load_head_for(args.head, target.model)
        eng = Engine(target.model, head, target.eos_token_ids)
        recs = load_prompts(args.dataset, split=args.split, n=args.n_prompts)
        eng.generate(encode_prompt(target.tokenizer, "Hi"), 8)
        online_tokens, online_s = 0, 0.0
        for r in recs:
            res = eng.generate(encode_prompt(target.tokenizer, list(r.messages)), args.max_new_tokens,
                               controller=StaticController(8, 10, 60))
            online_tokens += res.new_tokens
            online_s += res.wall_s
        env = environment_fingerprint(target.device, target.dtype)
        del eng, target, head
        # collection (in-process unless --use-ray), timed end to end including Parquet writes
        t0 = time.perf_counter()
        s = run_collect(cfg, tmp, use_ray=args.use_ray, progress=True)
        collect_s = time.perf_counter() - t0
        files = table_files(tmp, "positions")
        rows = sum(read_table(f, "positions", columns=["position"]).num_rows for f in files)
        nbytes = sum(f.stat().st_size for f in files)
        report = {"command": "python -m pipeline.bench_collect " + " ".join(argv or sys.argv[1:]),
                  "date": time.strftime("%Y-%m-%d"), "environment": env,
                  "config": json.loads(cfg.to_json()), "prompts": len(recs),
                  "collect_positions": s["positions"], "collect_wall_s": collect_s,
                  "collect_positions_per_s": s["positions"] / collect_s,
                  "online_positions": online_tokens, "online_wall_s": online_s,
                  "online_positions_per_s": online_tokens / online_s,
                  "ratio": (s["positions"] / collect_s) / (online_tokens / online_s),
                  "positions_rows": rows, "positions_bytes": nbytes, "bytes_per_row": nbytes / max(rows, 1)}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    txt = json.dumps(report, indent=2)
    print(txt)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(txt + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
