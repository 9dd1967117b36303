"""`draftgym collect`: the Ray Data job that runs `collect_prompt` over a prompt set.

One actor = one model copy (target + head), see pipeline/collect/actor.py for the shards it writes.
Ray runs embedded and local by default, or on the cluster named by RAY_ADDRESS (pipeline/collect/cluster.py:
the code and environment travel in a runtime_env; the pool is sized from the cluster's resources).
`--out` is a local path or a pyarrow filesystem URI (file://, s3://, gs://), resolved here on the
driver (pipeline/logs/storage.py); actors write through that filesystem, and the resume and orphan
checks below and the run manifest (`_runs/<run_key>.json`) go through it too.

Resume and idempotence: `run_key` hashes the data-defining config, so rerunning the same command
finds the prompts whose sequences shard exists and skips them; shard names are deterministic, so a
redone prompt overwrites rather than duplicates; positions shards without a sequences shard (a
killed actor) are deleted at start. The table then holds exactly one row per (sequence, position,
width). Prompts with a failures row are skipped too (and reported) unless `retry_failed`.

Bad prompts in a file, one policy: a prompt that is empty (no user message with text) or too long for
the target's positions is skipped, listed in the summary ("skipped") and in the failures table (error
'skipped: <why>'), and the rest are collected; the job is refused, in one line, only when no prompt is
usable.
"""
from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.parquet as pq

from pipeline.collect.prompt import CollectConfig
from pipeline.collect.actor import FAIL_AFTER_ENV, FAIL_PROMPT_ENV, CollectorActor, prompt_hash, shard_paths, table_dir
from pipeline.collect.cluster import check_actor_options, init_ray, node_resources, plan_actors
from pipeline.errors import DraftGymError, first_line
from pipeline.logs.storage import LogStore, resolve_out

__all__ = ["CollectJob", "run_collect", "run_collect_command", "done_hashes", "failed_prompts", "remove_orphans",
           "shard_paths", "init_ray"]
SKIPPED = "skipped: "           # a failures row's error for a skipped (unusable) prompt starts with this


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
    num_gpus / cpus_per_actor: None = from the cluster's resources (pipeline.collect.cluster.plan_actors).
    fail_after / fail_prompts (tests; also $DRAFTGYM_FAIL_AFTER / $DRAFTGYM_FAIL_PROMPT, read here on
    the driver): kill the actor after N prompts / make these prompt ids raise."""
    from tqdm import tqdm

    from pipeline.datasets import has_user_text, load_prompts
    from pipeline.runtime.fingerprint import environment_fingerprint

    store = out if isinstance(out, LogStore) else resolve_out(out)
    fail_after = fail_after or int(os.environ.get(FAIL_AFTER_ENV, "0") or 0)
    fail_prompts = tuple(fail_prompts) or tuple(p for p in os.environ.get(FAIL_PROMPT_ENV, "").split(",") if p)
    records = load_prompts(cfg.dataset, split=cfg.split, n=cfg.n_prompts, keep_empty=True)
    if not records:
        raise DraftGymError(f"no prompts in {cfg.dataset}" + (f" split {cfg.split}" if cfg.split else ""))
    if not any(has_user_text(r.messages) for r in records):
        raise DraftGymError(f"no usable prompt in {cfg.dataset}: all {len(records)} are empty")
    datasets = {r.dataset for r in records}
    try:
        for ds in datasets:
            remove_orphans(store, cfg, ds)
        done = {ds: done_hashes(store, cfg, ds) for ds in datasets}
        failed = {ds: failed_prompts(store, cfg, ds) for ds in datasets}
    except OSError as e:        # unreachable bucket, no permission: one line
        raise DraftGymError(f"cannot read --out {store.uri}: {first_line(e)}") from None
    todo, failed_before, skipped_before = [], [], []
    for r in records:
        h = prompt_hash(r.prompt_id)
        if h in done[r.dataset]:
            continue
        if h in failed[r.dataset] and not retry_failed:
            error = failed[r.dataset][h][1]
            if error.startswith(SKIPPED):          # unusable input: skipped again, not a failure to retry
                skipped_before.append(f"{r.prompt_id}: {error[len(SKIPPED):]}")
            else:
                failed_before.append(f"{r.prompt_id}: {error}")
            continue
        todo.append(r)
    n_done = len(records) - len(todo) - len(failed_before) - len(skipped_before)
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
                "already_done": n_done, "command": " ".join(sys.argv), "out": store.uri}
    try:
        store.write_json(manifest, manifest_path)
    except OSError as e:        # read-only, no permission: one line
        raise DraftGymError(f"cannot write to --out {store.uri}: {first_line(e)}") from None
    summary = {"run_key": cfg.run_key(), "prompts": len(records), "skipped_done": n_done,
               "collected": 0, "skipped": skipped_before, "failed": [], "failed_before": failed_before, "positions": 0,
               "wall_s": 0.0, "out": store.uri}
    if plan:
        summary.update(actors=plan["actors"], gpus_per_actor=plan["gpus"], cpus_per_actor=plan["cpus"])
    if not todo:
        return _refuse_if_nothing_usable(summary, cfg)
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
            summary["skipped"].append(f"{row['prompt_id']}: {status[len(SKIPPED):]}")
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
    return _refuse_if_nothing_usable(summary, cfg)


def _refuse_if_nothing_usable(summary: dict, cfg: CollectConfig) -> dict:
    """The summary, unless every prompt was skipped as unusable (nothing collected, now or before, and
    nothing failed): then the one-line error that the file holds no usable prompt."""
    s = summary
    if s["skipped"] and not (s["collected"] or s["skipped_done"] or s["failed"] or s["failed_before"]):
        raise DraftGymError(f"no usable prompt in {cfg.dataset}: all {len(s['skipped'])} were skipped "
                            f"(e.g. {s['skipped'][0]})")
    return summary


@dataclass
class CollectJob:
    """`draftgym collect`: what to log (`data`, whose fields define the run_key) and how the job runs."""

    data: CollectConfig = field(default_factory=CollectConfig)   # model, head, dtype (resolved), dataset,
                                                                   # split (resolved), widths, depth, T, ...
    out: str = "data/logs"                 # logs root: a local path or a pyarrow filesystem URI (s3://, gs://, file://)
    num_actors: int | None = None          # Ray actors, one model copy each; None: from the cluster's resources
    num_gpus: float | None = None          # GPUs per actor; None: 1 if any node has a GPU, else 0
    cpus_per_actor: float | None = None    # CPUs per actor; None: 1 with GPUs, else a node's (or a share of the cluster's)
    retry_failed: bool = False             # collect again the prompts with a failures row of an earlier run
    prompt_batch: int = 64                 # prompts one actor takes at a time (1 = one at a time)
    continuation_cache: bool = True        # reuse continuations from $DRAFTGYM_CACHE/continuations (and write them)
    use_ray: bool = True                   # False: run in-process (debugging)
    device: str | None = None              # None: cuda if present, else cpu
    as_json: bool = False                  # print the summary as one JSON object
    progress: bool = True                  # progress bars


def run_collect_command(job: CollectJob) -> int:
    """Check the job's settings (one line each), run `run_collect`, print the summary."""
    cfg = job.data
    if cfg.temperature < 0:
        raise DraftGymError(f"temperature must be >= 0, got {cfg.temperature}")
    if cfg.max_depth < 1:
        raise DraftGymError("--max-depth must be >= 1")
    if cfg.max_new_tokens < 1:                     # else every prompt would fail (and be skipped) one by one
        raise DraftGymError(f"--max-new-tokens must be >= 1, got {cfg.max_new_tokens}")
    if cfg.n_prompts is not None and cfg.n_prompts < 1:
        raise DraftGymError(f"--n-prompts must be >= 1, got {cfg.n_prompts}")
    if job.prompt_batch < 1:
        raise DraftGymError(f"--prompt-batch must be >= 1, got {job.prompt_batch}")
    if cfg.position_batch < 1:
        raise DraftGymError(f"--position-batch must be >= 1, got {cfg.position_batch}")
    check_actor_options(job.num_actors, job.num_gpus, job.cpus_per_actor)
    store = resolve_out(job.out)
    if cfg.head not in ("random", "default"):
        from pipeline.models.head import resolve_head_dir
        resolve_head_dir(cfg.head)
    s = run_collect(cfg, store, num_actors=job.num_actors, num_gpus=job.num_gpus, cpus_per_actor=job.cpus_per_actor,
                    use_ray=job.use_ray, device=job.device, retry_failed=job.retry_failed,
                    continuation_cache=job.continuation_cache, prompt_batch=job.prompt_batch, progress=job.progress)
    if job.as_json:
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
    if s["failed"] or s["failed_before"] or s["skipped"]:
        print(f"  all failures and skips: draftgym query --logs {s['out']} \"SELECT prompt_id, error FROM failures\"")
    return 0
