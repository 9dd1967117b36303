"""`make demo`: the main job on the embedded default, end to end on whatever device is here.

At this stage it decodes a few held-out prompts with autoregressive decoding and with EAGLE-3
(static default tree and a small tree) and prints tau and tokens/s side by side, checking that
every EAGLE-3 output equals the AR output. It uses the shipped default head when the checkout has
one, otherwise a random head (tau ~ 1: the head is what makes EAGLE-3 fast).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

from rich.console import Console
from rich.table import Table

from pipeline.controller import StaticController
from pipeline.datasets import load_prompts
from pipeline.engine import Engine
from pipeline.fingerprint import device_name
from pipeline.head import DEFAULT_HEAD_DIR, load_head, random_head
from pipeline.target import encode_prompt, load_target


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-prompts", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--datasets", default="mt-bench,humaneval")
    args = ap.parse_args(argv)
    console = Console()
    t0 = time.perf_counter()
    console.print("[bold]DraftGym demo[/bold]: loading smollm2-135m (first run dequantises the GGUF, ~20 s)")
    target = load_target("smollm2-135m")
    if (DEFAULT_HEAD_DIR / "config.json").is_file():
        head, head_name = load_head("default", target.model), "default (shipped)"
    else:
        head, head_name = random_head(target.model, seed=0), "random (no shipped head in this checkout)"
    eng = Engine(target.model, head, target.eos_token_ids)
    methods = {"ar": None, "eagle3 D=8 W=10 V=60": StaticController(8, 10, 60),
               "eagle3 D=3 W=10 V=8": StaticController(3, 10, 8)}
    warm = encode_prompt(target.tokenizer, "Hi")
    eng.generate_ar(warm, 4)
    eng.generate(warm, 4)
    table = Table(title=f"smollm2-135m on {device_name(target.device)}, head: {head_name}, "
                        f"{args.max_new_tokens} new tokens, greedy")
    for col in ("dataset", "prompt", "method", "tau", "tokens/s", "speedup", "lossless"):
        table.add_column(col)
    speed = {m: [] for m in methods}
    all_ok = True
    for ds in args.datasets.split(","):
        for rec in load_prompts(ds, split="test", n=args.n_prompts):
            ids = encode_prompt(target.tokenizer, list(rec.messages))
            ar = eng.generate_ar(ids, args.max_new_tokens)
            for name, ctrl in methods.items():
                res = ar if ctrl is None else eng.generate(ids, args.max_new_tokens, controller=ctrl)
                ok = res.output_ids == ar.output_ids
                all_ok &= ok
                speed[name].append(res.tokens_per_s)
                table.add_row(ds, rec.prompt_id.split("/", 1)[1][:18], name,
                              "1.00" if ctrl is None else f"{res.tau:.2f}", f"{res.tokens_per_s:.1f}",
                              f"{res.tokens_per_s / ar.tokens_per_s:.2f}x", "yes" if ok else "NO")
    console.print(table)
    for name, s in speed.items():
        console.print(f"  {name:24s} mean {statistics.mean(s):6.1f} tokens/s "
                      f"({statistics.mean(s) / statistics.mean(speed['ar']):.2f}x AR)")
    console.print(f"lossless on every prompt: {'yes' if all_ok else 'NO'}; demo took {time.perf_counter() - t0:.0f} s")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
