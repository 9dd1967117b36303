"""Collection benchmark: positions logged per second against the tokens per second
of online EAGLE-3 decoding, same machine, same prompts, same run; per dtype and per prompt batch.

    python -m tools.bench.collect --dataset sharegpt --split test --n-prompts 16 --max-new-tokens 64 \\
        --online-trees 8,10,60 2,10,8 --prompt-batches 1,4,16,64 --dtypes float32,bfloat16 \\
        --out data/reports/bench_collect.json

A "position" is one root of a cycle: collection logs every position of the continuation (for all
max_depth x V-grid static trees at once); online decoding visits one position per emitted token.
So the ratio says how much faster the logs of a prompt are made than decoding it once.

Per dtype: online EAGLE-3 with each static tree of --online-trees on the first --n-prompts prompts
(tokens/s per question, prefill included, as Spec-Bench), then `run_collect` in-process at each
--prompt-batches b (continuations generated together at batch b, then teacher-forced and expanded
8 prompts at a time, Parquet writes included, no continuation cache) on max(b, n) prompts: the same
n prompts, plus the next ones of the split where b > n. Every collection starts from an empty
output directory.

--warm also times the re-collection: the same prompts again, into another empty directory, with the
continuations already in the cache (a new head, new widths or a new Dmax on prompts collected
before: the AR continuation depends on the target, dtype and prompt only). The cache is a scratch
`$DRAFTGYM_CACHE` made for this run (its models/ linked to the real one), so the user's cache is
neither read nor written; the untimed first pass fills it.

--bracket decodes online again after the collections and compares against both passes together, so a
machine whose speed drifts during the run (shared VMs do, by several percent over minutes) does not
bias the ratio one way; both passes are in the report.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from pipeline.cliargs import DefaultsHelpFormatter, parse_positive_ints
from pipeline.collect.prompt import CollectConfig
from pipeline.collect.job import run_collect
from pipeline.decode.controller import StaticController
from pipeline.datasets import load_prompts
from pipeline.decode.engine.single import Engine
from pipeline.errors import DraftGymError
from pipeline.runtime.fingerprint import dtype_name, environment_fingerprint
from pipeline.models.head import load_head_for
from pipeline.logs.schema import read_table, table_files
from pipeline.models.target import encode_prompt, load_target
from pipeline.runtime.atomic import atomic_write_json


def parse_tree(spec: str) -> tuple[int, int, int]:
    d = parse_positive_ints(spec, "--online-trees")
    if len(d) != 3:
        raise DraftGymError(f"--online-trees takes D,W,V triples, got {spec!r}")
    return d


def prompt_file(args, tok, n: int, path: Path) -> Path:
    """The first n prompts of the split with at most --max-prompt-tokens tokens, as a JSONL prompt file
    (used whole by run_collect and by the online runs), so every measurement sees one prompt set."""
    recs = [r for r in load_prompts(args.dataset, split=args.split)
            if args.max_prompt_tokens is None or len(encode_prompt(tok, list(r.messages))) <= args.max_prompt_tokens][:n]
    if len(recs) < n:
        raise DraftGymError(f"only {len(recs)} prompts of {args.dataset} {args.split} have <= {args.max_prompt_tokens} tokens")
    path.write_text("".join(json.dumps({"prompt_id": r.prompt_id, "messages": list(r.messages)}) + "\n" for r in recs))
    return path


def online(args, dtype: str, tree: tuple[int, int, int]) -> dict:
    """Online EAGLE-3 with a static tree on the first n prompts: tokens, seconds, tokens/s."""
    target = load_target(args.model, dtype=dtype)
    eng = Engine(target.model, load_head_for(args.head, target.model), target.eos_token_ids)
    eng.generate(encode_prompt(target.tokenizer, "Hi"), 8)                               # warm-up
    tokens, secs = 0, 0.0
    for r in load_prompts(args.prompts, n=args.n_prompts):
        res = eng.generate(encode_prompt(target.tokenizer, list(r.messages)), args.max_new_tokens,
                           controller=StaticController(*tree))
        tokens, secs = tokens + res.new_tokens, secs + res.wall_s
    return {"tree": list(tree), "tokens": tokens, "wall_s": secs, "tokens_per_s": tokens / secs,
            "environment": environment_fingerprint(target.device, target.dtype)}


def collection(args, dtype: str, batch: int, warm: bool = False) -> dict:
    """run_collect in-process at prompt batch `batch` on max(batch, n) prompts, from an empty directory.
    warm: with every continuation already cached (module docstring), the cache filled by an untimed pass."""
    tmp = Path(tempfile.mkdtemp(prefix="draftgym-bench-collect-"))
    old_cache = os.environ.get("DRAFTGYM_CACHE")
    try:
        cfg = CollectConfig(model=args.model, head=args.head, dataset=str(args.prompts), split=None,
                            n_prompts=max(batch, args.n_prompts), max_new_tokens=args.max_new_tokens, dtype=dtype)
        if warm:
            from pipeline.runtime.cache import cache_dir

            models = cache_dir() / "models"
            os.environ["DRAFTGYM_CACHE"] = str(tmp / "cache")
            (tmp / "cache").mkdir()
            if models.is_dir():
                (tmp / "cache" / "models").symlink_to(models.resolve(), target_is_directory=True)
            run_collect(cfg, tmp / "fill", use_ray=False, progress=False, prompt_batch=batch, continuation_cache=True)
        out = tmp / "out"
        t0 = time.perf_counter()
        s = run_collect(cfg, out, use_ray=False, progress=False, prompt_batch=batch, continuation_cache=warm)
        wall = time.perf_counter() - t0
        files = table_files(out, "positions")
        rows = sum(read_table(f, "positions", columns=["position"]).num_rows for f in files)
        nbytes = sum(f.stat().st_size for f in files)
    finally:
        if warm:
            if old_cache is None:
                os.environ.pop("DRAFTGYM_CACHE", None)
            else:
                os.environ["DRAFTGYM_CACHE"] = old_cache
        shutil.rmtree(tmp, ignore_errors=True)
    if s["failed"]:
        raise DraftGymError(f"collection failed on {len(s['failed'])} prompts: {s['failed'][0]}")
    return {"prompt_batch": batch, "warm": warm, "prompts": s["collected"], "positions": s["positions"], "wall_s": wall,
            "positions_per_s": s["positions"] / wall, "bytes_per_row": nbytes / max(rows, 1)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=DefaultsHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m", help="target model id or path")
    ap.add_argument("--head", default="default", help="draft head ('default', 'random' or a path)")
    ap.add_argument("--dataset", default="mt-bench", help="built-in prompt set or a file")
    ap.add_argument("--split", default="test", help="split of the prompt set")
    ap.add_argument("--n-prompts", type=int, default=8, help="prompts of the online runs (and of every collection)")
    ap.add_argument("--max-prompt-tokens", type=int, default=None,
                    help="only prompts of at most this many tokens (the positions/s of both sides fall with the "
                         "context length, so the batch-64 set must be drawn like the first n)")
    ap.add_argument("--max-new-tokens", type=int, default=128, help="new tokens per prompt, online and logged")
    ap.add_argument("--online-trees", nargs="+", default=["8,10,60"], metavar="D,W,V",
                    help="static trees decoded online (the static default is 8,10,60; add the machine's grid-best)")
    ap.add_argument("--prompt-batches", default="8", help="comma-separated collection prompt batches")
    ap.add_argument("--dtypes", default=None,
                    help="comma-separated compute dtypes, each measured in turn in this run "
                         "(default: pipeline.models.target.default_cpu_dtype on a CPU, bf16 on a GPU)")
    ap.add_argument("--warm", action="store_true",
                    help="also time each prompt batch's re-collection with the continuations cached (a new head or "
                         "new widths on the same prompts); the cache is a scratch one, not the user's")
    ap.add_argument("--bracket", action="store_true",
                    help="decode online again after the collections and take each tree's tokens/s over both passes "
                         "(the speed of a shared VM drifts over minutes; the report keeps both passes)")
    ap.add_argument("--out", default=None, help="write the JSON report here")
    args = ap.parse_args(argv)
    trees = [parse_tree(t) for t in args.online_trees]
    batches = parse_positive_ints(args.prompt_batches, "--prompt-batches")
    first = load_target(args.model)                      # the tokenizer, and the default dtype
    dtypes = args.dtypes.split(",") if args.dtypes else [dtype_name(first.dtype)]
    tmp = Path(tempfile.mkdtemp(prefix="draftgym-bench-prompts-"))
    args.prompts = prompt_file(args, first.tokenizer, max([args.n_prompts, *batches]), tmp / "prompts.jsonl")
    del first

    report = {"command": "python -m tools.bench.collect " + " ".join(argv or sys.argv[1:]),
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "runs": []}
    for dt in dtypes:
        run = {"dtype": dt, "online": [online(args, dt, t) for t in trees],
               "collection": [collection(args, dt, b, warm) for b in batches for warm in
                              ((False, True) if args.warm else (False,))]}
        if args.bracket:      # online, collections, online: ratios against both passes together
            for o, again in zip(run["online"], [online(args, dt, t) for t in trees]):
                o["passes_tokens_per_s"] = [o["tokens_per_s"], again["tokens_per_s"]]
                o["tokens"], o["wall_s"] = o["tokens"] + again["tokens"], o["wall_s"] + again["wall_s"]
                o["tokens_per_s"] = o["tokens"] / o["wall_s"]
        run["environment"] = run["online"][0].pop("environment")
        for o in run["online"][1:]:
            o.pop("environment")
        for c in run["collection"]:
            c["ratio"] = {",".join(map(str, o["tree"])): c["positions_per_s"] / o["tokens_per_s"] for o in run["online"]}
        report["runs"].append(run)
        print(json.dumps(run), flush=True)
    kinds = [(b, w) for b in batches for w in ((False, True) if args.warm else (False,))]
    lines = ["| dtype | online tree (D,W,V): tokens/s | " + " | ".join(
        f"collection, prompt batch {b}{', continuations cached' if w else ''}: positions/s (x each online)"
        for b, w in kinds) + " |", "|---" * (2 + len(kinds)) + "|"]
    for run in report["runs"]:
        on = "; ".join(f"({','.join(map(str, o['tree']))}) {o['tokens_per_s']:.1f}"
                       + (" ({:.1f} before, {:.1f} after)".format(*o["passes_tokens_per_s"]) if "passes_tokens_per_s" in o else "")
                       for o in run["online"])
        cells = [f"{c['positions_per_s']:.1f} (" + ", ".join(f"{r:.2f}x" for r in c["ratio"].values()) + ")"
                 for c in run["collection"]]
        lines.append(f"| {run['dtype']} | {on} | " + " | ".join(cells) + " |")
    report["table"] = "\n".join(lines)
    shutil.rmtree(tmp, ignore_errors=True)
    print(report["table"])
    if args.out:
        atomic_write_json(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
