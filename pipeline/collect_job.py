"""`draftgym collect`: the Ray Data job that runs `collect_prompt` over a prompt set.

One actor = one model copy (target + head), see pipeline/collect_actor.py for the shards it writes.
Ray runs embedded and local by default, or on the cluster named by RAY_ADDRESS (pipeline/cluster.py:
the code and environment travel in a runtime_env; the pool is sized from the cluster's resources).
`--out` is a local path or a pyarrow filesystem URI (file://, s3://, gs://), resolved here on the
driver (pipeline/storage.py); actors write through that filesystem, and the resume and orphan
checks below and the run manifest (`_runs/<run_key>.json`) go through it too.

Resume and idempotence: `run_key` hashes the data-defining config, so rerunning the same command
finds the prompts whose sequences shard exists and skips them; shard names are deterministic, so a
redone prompt overwrites rather than duplicates; positions shards without a sequences shard (a
killed actor) are deleted at start. The table then holds exactly one row per (sequence, position,
width). Prompts with a failures row are skipped too (and reported) unless `retry_failed`.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

from pipeline.cliargs import add_device_dtype, add_model_head, add_no_progress, add_split, parse_positive_ints
from pipeline.collect import CollectConfig
from pipeline.collect_actor import (FAIL_AFTER_ENV, FAIL_PROMPT_ENV, GEN_TOKENS, GROUP_PROMPTS, GROUP_TOKENS,
                                    CollectorActor, prompt_hash, shard_paths, table_dir)
from pipeline.cluster import check_actor_options, init_ray, node_resources, plan_actors
from pipeline.errors import DraftGymError
from pipeline.storage import LogStore, resolve_out

__all__ = ["run_collect", "done_hashes", "failed_prompts", "remove_orphans", "shard_paths", "init_ray", "add_collect"]


def _hashes(store: LogStore, table: str, cfg: CollectConfig, dataset: str) -> dict[str, str]:
    """{prompt_hash: file name} of this run_key's shards of one table (sequences or failures)."""
    key = cfg.run_key()
    return {name[len(key) + 1: -len(".parquet")]: name
            for name in store.list_files(table_dir(store, table, cfg, dataset), ".parquet") if name.startswith(key + "-")}


def done_hashes(store: LogStore, cfg: CollectConfig, dataset: str) -> set[str]:
    """Prompt hashes of this run_key whose sequences shard exists (committed prompts)."""
    return set(_hashes(store, "sequences", cfg, dataset))


def failed_prompts(store: LogStore, cfg: CollectConfig, dataset: str) -> dict[str, tuple[str, str]]:
    """{prompt_hash: (prompt_id, error)} of this run_key's failures rows."""
    out = {}
    d = table_dir(store, "failures", cfg, dataset)
    for h, name in _hashes(store, "failures", cfg, dataset).items():
        t = pq.read_table(f"{d}/{name}", filesystem=store.fs, columns=["prompt_id", "error"])
        out[h] = (t["prompt_id"][0].as_py(), t["error"][0].as_py())
    return out


def remove_orphans(store: LogStore, cfg: CollectConfig, dataset: str) -> int:
    """Delete what a killed actor leaves: positions shards of uncommitted prompts, temp files, and
    failures rows of prompts committed since. Returns the number of positions shards deleted."""
    done = done_hashes(store, cfg, dataset)
    key, n = cfg.run_key(), 0
    pos = table_dir(store, "positions", cfg, dataset)
    for name in store.list_files(pos, ".parquet"):
        if name.startswith(key + "-") and name.split("-")[1] not in done:
            store.fs.delete_file(f"{pos}/{name}")
            n += 1
    for table in ("positions", "sequences", "failures"):
        d = table_dir(store, table, cfg, dataset)
        for name in store.list_files(d, ".tmp"):
            if name.startswith("."):
                store.fs.delete_file(f"{d}/{name}")
    fail = table_dir(store, "failures", cfg, dataset)
    for h, name in _hashes(store, "failures", cfg, dataset).items():
        if h in done:
            store.fs.delete_file(f"{fail}/{name}")
    return n


def _local_or_id(spec: str, reserved: tuple[str, ...] = ()) -> str:
    """A model/head given as a local path -> absolute (workers may run elsewhere); ids unchanged."""
    if spec in reserved or "://" in spec:
        return spec
    p = Path(spec).expanduser()
    return str(p.absolute()) if p.exists() else spec


def run_collect(cfg: CollectConfig, out: str | Path | LogStore, num_actors: int | None = None,
                num_gpus: float | None = None, cpus_per_actor: float | None = None, use_ray: bool = True,
                progress: bool = True, device: str | None = None, fail_after: int = 0,
                fail_prompts: tuple[str, ...] = (), retry_failed: bool = False, prompt_batch: int = 64,
                continuation_cache: bool = True) -> dict:
    """Collect logs for every prompt of cfg.dataset not yet collected (nor failed, unless retry_failed)
    under this run_key. out: a local path, a pyarrow filesystem URI or a LogStore. num_actors /
    num_gpus / cpus_per_actor: None = from the cluster's resources (pipeline.cluster.plan_actors).
    fail_after / fail_prompts (tests; also $DRAFTGYM_FAIL_AFTER / $DRAFTGYM_FAIL_PROMPT, read here on
    the driver): kill the actor after N prompts / make these prompt ids raise."""
    from tqdm import tqdm

    from pipeline.datasets import load_prompts
    from pipeline.fingerprint import environment_fingerprint

    store = out if isinstance(out, LogStore) else resolve_out(out)
    fail_after = fail_after or int(os.environ.get(FAIL_AFTER_ENV, "0") or 0)
    fail_prompts = tuple(fail_prompts) or tuple(p for p in os.environ.get(FAIL_PROMPT_ENV, "").split(",") if p)
    records = load_prompts(cfg.dataset, split=cfg.split, n=cfg.n_prompts)
    if not records:
        raise DraftGymError(f"no prompts in {cfg.dataset}" + (f" split {cfg.split}" if cfg.split else ""))
    datasets = {r.dataset for r in records}
    try:
        for ds in datasets:
            remove_orphans(store, cfg, ds)
        done = {ds: done_hashes(store, cfg, ds) for ds in datasets}
        failed = {ds: failed_prompts(store, cfg, ds) for ds in datasets}
    except OSError as e:        # unreachable bucket, no permission: one line
        raise DraftGymError(f"cannot read --out {store.uri}: {str(e).splitlines()[0] if str(e) else e!r}") from None
    todo, failed_before = [], []
    for r in records:
        h = prompt_hash(r.prompt_id)
        if h in done[r.dataset]:
            continue
        if h in failed[r.dataset] and not retry_failed:
            failed_before.append(f"{r.prompt_id}: {failed[r.dataset][h][1]}")
            continue
        todo.append(r)
    if num_gpus is None and device is not None and str(device).startswith("cpu"):
        num_gpus = 0.0                                      # --device cpu: reserve no GPU
    plan = None
    if todo and use_ray:      # connect (a one-line error if the cluster is unreachable) before writing anything
        ray = init_ray()
        plan = plan_actors(node_resources(), num_actors, num_gpus, cpus_per_actor)
        plan["actors"] = min(plan["actors"], len(todo))    # no model copy without a prompt to work on
    env = environment_fingerprint(device, cfg.dtype)
    manifest_path = store.path("_runs", f"{cfg.run_key()}.json")
    manifest = {"run_key": cfg.run_key(), "config": json.loads(cfg.to_json()), "environment": env,
                "started_at": time.strftime("%Y-%m-%dT%H:%M:%S"), "n_prompts": len(records),
                "already_done": len(records) - len(todo) - len(failed_before), "command": " ".join(sys.argv), "out": store.uri}
    try:
        store.write_json(manifest, manifest_path)
    except OSError as e:        # read-only, no permission: one line
        raise DraftGymError(f"cannot write to --out {store.uri}: {str(e).splitlines()[0] if str(e) else e!r}") from None
    summary = {"run_key": cfg.run_key(), "prompts": len(records), "skipped_done": len(records) - len(todo) - len(failed_before),
               "collected": 0, "skipped": [], "failed": [], "failed_before": failed_before, "positions": 0,
               "wall_s": 0.0, "out": store.uri}
    if plan:
        summary.update(actors=plan["actors"], gpus_per_actor=plan["gpus"], cpus_per_actor=plan["cpus"])
    if not todo:
        return summary
    items = [{"prompt_id": r.prompt_id, "dataset": r.dataset, "split": r.split,
              "messages": json.dumps(list(r.messages))} for r in todo]
    actor_kw = dict(cfg_json=cfg.to_json(), store=store, device=device, fail_after=fail_after,
                    continuation_cache=continuation_cache,
                    fail_prompts=fail_prompts, model_path=_local_or_id(cfg.model),
                    head_spec=_local_or_id(cfg.head, ("random", "default")))
    t0 = time.perf_counter()
    bar = tqdm(total=len(items), desc=f"collect {cfg.dataset}", unit="prompt", disable=not progress)

    def account(row):
        status = str(row["status"])
        if status == "ok":
            summary["collected"] += 1
            summary["positions"] += int(row["positions"])
        elif status.startswith("failed: "):
            summary["failed"].append(f"{row['prompt_id']}: {status[len('failed: '):]}")
        else:
            summary["skipped"].append(f"{row['prompt_id']}: {status}")
        bar.update(1)
        bar.set_postfix(positions=summary["positions"], failed=len(summary["failed"]))

    try:
        if plan:
            ds = ray.data.from_items(items, override_num_blocks=-(-len(items) // prompt_batch)).map_batches(
                CollectorActor, batch_size=prompt_batch, compute=ray.data.ActorPoolStrategy(size=plan["actors"]),
                num_cpus=plan["cpus"], num_gpus=plan["gpus"], fn_constructor_kwargs=actor_kw)
            for row in ds.iter_rows():
                account(row)
        else:
            actor = CollectorActor(**actor_kw)
            for c in range(0, len(items), prompt_batch):
                chunk = items[c:c + prompt_batch]
                res = actor({k: [it[k] for it in chunk] for k in chunk[0]})
                for i in range(len(chunk)):
                    account({k: v[i] for k, v in res.items()})
    finally:
        bar.close()
    summary["wall_s"] = time.perf_counter() - t0
    manifest.update(finished_at=time.strftime("%Y-%m-%dT%H:%M:%S"), last_summary=summary)
    store.write_json(manifest, manifest_path)
    return summary


def add_collect(sub) -> None:
    p = sub.add_parser("collect", help="log per-position draft trees and acceptance tables (Ray job)")
    add_model_head(p)
    p.add_argument("--dataset", default="mt-bench", help="a built-in prompt set (see `draftgym datasets`) or a JSON/JSONL/Parquet file")
    add_split(p)
    p.add_argument("--n-prompts", type=int, default=10, help="first N prompts of the split")
    p.add_argument("--max-new-tokens", type=int, default=128, help="logged continuation length per prompt (episode length)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy continuation; > 0 samples it (and logs acceptance distributions)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (T > 0) and random-head seed")
    p.add_argument("--widths", default="10", help="comma-separated W values")
    p.add_argument("--max-depth", type=int, default=12, help="deepest tree logged (Dmax): acceptance tables cover D = 1..Dmax")
    p.add_argument("--position-batch", type=int, default=CollectConfig.position_batch,
                   help="roots expanded together in one batched draft forward (x the width = rows per head matmul); "
                        "larger uses more memory at long contexts")
    p.add_argument("--dist-every", type=int, default=1,
                   help="T > 0: log acceptance-length distributions at every k-th position (0 = never; each costs a verify forward)")
    p.add_argument("--dist-verify-size", type=int, default=60, help="T > 0: V of the tree whose acceptance-length distribution is logged")
    p.add_argument("--num-actors", type=int, default=None,
                   help="Ray actors, one model copy each (default: from the cluster's resources: one per GPU "
                        "(per --num-gpus GPUs) on a GPU cluster, one per node (all its CPUs, or one per "
                        "--cpus-per-actor CPUs) on a CPU cluster; at least 1, at most one per prompt)")
    p.add_argument("--num-gpus", type=float, default=None,
                   help="GPUs per actor (default: 1 if any node of the Ray cluster has a GPU, else 0; read from "
                        "the cluster, not from this machine)")
    p.add_argument("--cpus-per-actor", type=float, default=None,
                   help="CPUs per actor (default: 1 with GPUs; on a CPU cluster the largest node's CPUs, or the "
                        "cluster's CPUs shared among --num-actors)")
    p.add_argument("--retry-failed", action="store_true",
                   help="collect again the prompts recorded in the failures table by an earlier run of the same "
                        "command (without it they are skipped and listed); a success deletes their failures row")
    p.add_argument("--prompt-batch", type=int, default=64,
                   help="prompts one actor takes at a time: sorted by length, their continuations are generated "
                        f"together (batches of <= {GEN_TOKENS} slot tokens; cached on the actor's node under "
                        "$DRAFTGYM_CACHE/continuations), then teacher-forced and expanded in groups of similar length "
                        f"(<= {GROUP_PROMPTS} prompts, <= {GROUP_TOKENS} padded tokens), each group committed before "
                        "the next (pipeline.collect.collect_prompts); 1 = one prompt at a time")
    p.add_argument("--no-continuation-cache", action="store_true",
                   help="generate every continuation afresh: neither read nor write $DRAFTGYM_CACHE/continuations "
                        "(benchmarks; by default a continuation is reused by any later run with the same model, "
                        "dtype, device, prompt, temperature, seed and length, whatever the head or widths)")
    p.add_argument("--no-ray", action="store_true", help="run in-process (debugging)")
    add_device_dtype(p)
    p.add_argument("--out", default="data/logs",
                   help="logs root (hive-partitioned Parquet): a local path (made absolute on this machine, the "
                        "driver) or a pyarrow filesystem URI: file:///abs/path, s3://bucket/prefix, gs://bucket/prefix "
                        "(every worker writes there; use shared storage or an object store on a multi-node cluster)")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    add_no_progress(p)
    p.set_defaults(func=_run_collect_cli)


def _run_collect_cli(args) -> int:
    if args.temperature < 0:
        raise DraftGymError(f"temperature must be >= 0, got {args.temperature}")
    from pipeline.datasets import resolve_split
    from pipeline.target import resolve_dtype_name

    widths = parse_positive_ints(args.widths, "--widths")
    if args.max_depth < 1:
        raise DraftGymError("--max-depth must be >= 1")
    if args.prompt_batch < 1:
        raise DraftGymError(f"--prompt-batch must be >= 1, got {args.prompt_batch}")
    if args.position_batch < 1:
        raise DraftGymError(f"--position-batch must be >= 1, got {args.position_batch}")
    check_actor_options(args.num_actors, args.num_gpus, args.cpus_per_actor)
    store = resolve_out(args.out)
    cfg = CollectConfig(model=args.model, head=args.head, dtype=resolve_dtype_name(args.dtype, args.device),
                        dataset=args.dataset,
                        split=resolve_split(args.dataset, args.split), n_prompts=args.n_prompts,
                        max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed,
                        widths=widths, max_depth=args.max_depth, position_batch=args.position_batch,
                        dist_every=args.dist_every, dist_verify_size=args.dist_verify_size)
    if args.head not in ("random", "default"):
        from pipeline.head import resolve_head_dir
        resolve_head_dir(args.head)
    s = run_collect(cfg, store, num_actors=args.num_actors, num_gpus=args.num_gpus, cpus_per_actor=args.cpus_per_actor,
                    use_ray=not args.no_ray, device=args.device, retry_failed=args.retry_failed,
                    continuation_cache=not args.no_continuation_cache,
                    prompt_batch=args.prompt_batch, progress=not args.no_progress)
    if args.json:
        print(json.dumps(s))
        return 0
    rate = s["positions"] / s["wall_s"] if s["wall_s"] else 0.0
    print(f"collected {s['collected']} prompts ({s['skipped_done']} already done, {len(s['skipped'])} skipped, "
          f"{len(s['failed'])} failed), {s['positions']} positions in {s['wall_s']:.1f} s ({rate:.1f} positions/s) "
          f"-> {s['out']} [run_key {s['run_key']}]")
    if "actors" in s:
        print(f"  {s['actors']} actor(s), {s['gpus_per_actor']:g} GPU and {s['cpus_per_actor']:g} CPU each")
    for line in s["skipped"][:5]:
        print(f"  skipped {line}")
    for line in s["failed"][:10]:
        print(f"  failed {line}")
    if s["failed_before"]:
        print(f"  {len(s['failed_before'])} prompt(s) failed in an earlier run and were not retried "
              f"(--retry-failed retries them):")
        for line in s["failed_before"][:10]:
            print(f"    {line}")
    if s["failed"] or s["failed_before"]:
        print(f"  all failures: draftgym query --logs {s['out']} \"SELECT prompt_id, error FROM failures\"")
    return 0
