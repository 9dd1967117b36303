"""`draftgym collect`: the Ray Data job that runs `collect_prompt` over a prompt set.

One actor = one model copy (target + head). Ray runs embedded and local by default, or on the
cluster named by RAY_ADDRESS. Each actor writes its own shards atomically (temp file + rename):

    positions/<partition>/<run_key>-<prompt_hash>-w<W>.parquet    (one per width)
    sequences/<partition>/<run_key>-<prompt_hash>.parquet         (written last: the commit marker)

Resume and idempotence: `run_key` hashes the data-defining config, so rerunning the same command
finds the prompts whose sequences shard exists and skips them; shard names are deterministic, so a
redone prompt overwrites rather than duplicates; positions shards without a sequences shard (a
killed actor) are deleted at start. The table then holds exactly one row per (sequence, position,
width).
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from pipeline.cliargs import add_device_dtype, add_model_head, add_split, parse_positive_ints
from pipeline.collect import CollectConfig, collect_prompt
from pipeline.errors import DraftGymError
from pipeline.schema import (SCHEMA_VERSION, SEQUENCES, partition_dir, positions_schema, write_atomic,
                             write_json_atomic)

FAIL_AFTER_ENV = "DRAFTGYM_FAIL_AFTER"   # tests: an actor raises after this many prompts


def prompt_hash(prompt_id: str) -> str:
    return hashlib.sha1(prompt_id.encode()).hexdigest()[:16]


def shard_paths(out: Path, cfg: CollectConfig, dataset: str, prompt_id: str) -> tuple[Path, dict[int, Path]]:
    key, h = cfg.run_key(), prompt_hash(prompt_id)
    seq = partition_dir(out, "sequences", cfg.model, dataset, cfg.temperature) / f"{key}-{h}.parquet"
    pos = {W: partition_dir(out, "positions", cfg.model, dataset, cfg.temperature) / f"{key}-{h}-w{W}.parquet"
           for W in cfg.widths}
    return seq, pos


def done_hashes(out: Path, cfg: CollectConfig, dataset: str) -> set[str]:
    """Prompt hashes of this run_key whose sequences shard exists (committed prompts)."""
    d = partition_dir(out, "sequences", cfg.model, dataset, cfg.temperature)
    key = cfg.run_key()
    return {p.stem.split("-", 1)[1] for p in d.glob(f"{key}-*.parquet")} if d.is_dir() else set()


def remove_orphans(out: Path, cfg: CollectConfig, dataset: str) -> int:
    """Delete positions shards (and temp files) left by a killed actor before its commit."""
    done = done_hashes(out, cfg, dataset)
    d = partition_dir(out, "positions", cfg.model, dataset, cfg.temperature)
    n = 0
    if d.is_dir():
        key = cfg.run_key()
        for p in d.glob(f"{key}-*.parquet"):
            if p.stem.split("-")[1] not in done:
                p.unlink()
                n += 1
        for p in d.glob(".*.tmp"):
            p.unlink()
    return n


class CollectorActor:
    """Holds one model copy; processes prompt batches; writes shards; returns one summary row each."""

    def __init__(self, cfg_json: str, out: str, device: str | None = None, fail_after: int = 0):
        import torch

        from pipeline.engine import Engine
        from pipeline.generate import load_head_for
        from pipeline.target import load_target

        self.cfg = CollectConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in json.loads(cfg_json).items()})
        self.out = Path(out)
        self.target = load_target(self.cfg.model, device=device, dtype=self.cfg.dtype)
        # the fingerprint of the machine this actor runs on (on a cluster, not the driver's); the
        # driver's own goes into the run manifest
        from pipeline.fingerprint import environment_fingerprint
        self.env_json = json.dumps(environment_fingerprint(self.target.device, self.target.dtype))
        self.head = load_head_for(self.cfg.head, self.target.model, self.cfg.seed)
        self.engine = Engine(self.target.model, self.head, self.target.eos_token_ids)
        self.fail_after = fail_after or int(os.environ.get(FAIL_AFTER_ENV, "0") or 0)
        self.done = 0
        torch.manual_seed(self.cfg.seed)

    def __call__(self, batch: dict) -> dict:
        from pipeline.target import encode_prompt

        rows = {"prompt_id": [], "status": [], "positions": [], "seconds": []}
        for pid, ds, split, msgs in zip(batch["prompt_id"], batch["dataset"], batch["split"], batch["messages"]):
            if self.fail_after and self.done >= self.fail_after:
                raise RuntimeError(f"injected failure after {self.done} prompts ({FAIL_AFTER_ENV})")
            t0 = time.perf_counter()
            try:
                max_prompt = self.engine.max_positions - self.cfg.max_new_tokens - 2 * self.cfg.max_depth - 2
                ids = encode_prompt(self.target.tokenizer, json.loads(msgs), max_prompt_tokens=max_prompt)
            except DraftGymError as e:
                rows["prompt_id"].append(pid); rows["status"].append(f"skipped: {e}")
                rows["positions"].append(0); rows["seconds"].append(0.0)
                continue
            log = collect_prompt(self.engine, self.head, ids, self.cfg)
            self._write(pid, ds, split, ids, log, time.perf_counter() - t0)
            self.done += 1
            rows["prompt_id"].append(pid); rows["status"].append("ok")
            rows["positions"].append(sum(len(c["position"]) for c in log.positions.values()))
            rows["seconds"].append(time.perf_counter() - t0)
        return {k: np.array(v) for k, v in rows.items()}

    def _write(self, pid, ds, split, ids, log, seconds) -> None:
        cfg, key = self.cfg, self.cfg.run_key()
        seq_path, pos_paths = shard_paths(self.out, cfg, ds, pid)
        n_grid = len(cfg.verify_grid)
        for W, cols in log.positions.items():
            n = len(cols["position"])
            with_dist = "accept_dist" in cols
            schema = positions_schema(cfg.max_depth, W, n_grid, with_dist=with_dist)
            arrays = [pa.array(np.full(n, SCHEMA_VERSION, np.int16)), pa.array([key] * n), pa.array([pid] * n),
                      pa.array(cols["position"].astype(np.int32)), pa.array(cols["context_len"].astype(np.int32)),
                      pa.array(cols["width"].astype(np.int16)), pa.array(cols["root_token"].astype(np.int32))]
            for name in ("acceptance", "beam_scores", "candidate_scores", "entropy"):
                typ = schema.field(name).type
                flat = cols[name].reshape(-1).astype(typ.value_type.to_pandas_dtype())
                arrays.append(pa.FixedSizeListArray.from_arrays(pa.array(flat), typ.list_size))
            if with_dist:  # null where the position was subsampled out (--dist-every)
                arrays.append(pa.array([None if d is None else d.tolist() for d in cols["accept_dist"]],
                                       type=schema.field("accept_dist").type))
            write_atomic(pa.Table.from_arrays(arrays, schema=schema), pos_paths[W], "positions")
        row = {"schema_version": SCHEMA_VERSION, "run_key": key, "prompt_id": pid, "split": split,
               "model_id": cfg.model, "head_id": self.head.head_id, "dtype": cfg.dtype, "seed": cfg.seed, "prompt_tokens": ids,
               "output_tokens": log.output_tokens, "new_tokens": log.new_tokens, "stop_reason": log.stop_reason,
               "widths": list(cfg.widths), "max_depth": cfg.max_depth, "verify_grid": list(cfg.verify_grid),
               "config_json": cfg.to_json(), "env_json": self.env_json, "collect_s": seconds}
        write_atomic(pa.Table.from_pylist([row], schema=SEQUENCES), seq_path, "sequences")


def init_ray(num_cpus: int | None = None):
    import ray

    if ray.is_initialized():
        return ray
    addr = os.environ.get("RAY_ADDRESS")
    kw = dict(include_dashboard=False, log_to_driver=True, configure_logging=False)
    if addr:
        try:
            ray.init(address=addr, **kw)
        except Exception as e:      # ConnectionError, an auth refusal, a version mismatch: one line, no traceback
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise DraftGymError(f"cannot reach the Ray cluster at RAY_ADDRESS={addr}: {first}") from None
    else:
        ray.init(num_cpus=num_cpus or os.cpu_count(), **kw)
    from ray.data import DataContext
    DataContext.get_current().enable_progress_bars = False      # our own tqdm bar below
    return ray


def run_collect(cfg: CollectConfig, out: str | Path, num_actors: int = 1, num_gpus: float = 0.0,
                use_ray: bool = True, progress: bool = True, device: str | None = None, fail_after: int = 0) -> dict:
    """Collect logs for every prompt of cfg.dataset not yet collected under this run_key."""
    from tqdm import tqdm

    from pipeline.datasets import load_prompts
    from pipeline.fingerprint import environment_fingerprint

    out = Path(out)
    records = load_prompts(cfg.dataset, split=cfg.split, n=cfg.n_prompts)
    if not records:
        raise DraftGymError(f"no prompts in {cfg.dataset}" + (f" split {cfg.split}" if cfg.split else ""))
    datasets = {r.dataset for r in records}
    for ds in datasets:
        remove_orphans(out, cfg, ds)
    done = {ds: done_hashes(out, cfg, ds) for ds in datasets}
    todo = [r for r in records if prompt_hash(r.prompt_id) not in done[r.dataset]]
    env = environment_fingerprint(device, cfg.dtype)
    manifest_path = out / "_runs" / f"{cfg.run_key()}.json"
    manifest = {"run_key": cfg.run_key(), "config": json.loads(cfg.to_json()), "environment": env,
                "started_at": time.strftime("%Y-%m-%dT%H:%M:%S"), "n_prompts": len(records),
                "already_done": len(records) - len(todo), "command": " ".join(sys.argv)}
    write_json_atomic(manifest, manifest_path)
    summary = {"run_key": cfg.run_key(), "prompts": len(records), "skipped_done": len(records) - len(todo),
               "collected": 0, "skipped": [], "positions": 0, "wall_s": 0.0, "out": str(out)}
    if not todo:
        return summary
    items = [{"prompt_id": r.prompt_id, "dataset": r.dataset, "split": r.split,
              "messages": json.dumps(list(r.messages))} for r in todo]
    t0 = time.perf_counter()
    bar = tqdm(total=len(items), desc=f"collect {cfg.dataset}", unit="prompt", disable=not progress)

    def account(row):
        if row["status"] == "ok":
            summary["collected"] += 1
            summary["positions"] += int(row["positions"])
        else:
            summary["skipped"].append(f"{row['prompt_id']}: {row['status']}")
        bar.update(1)
        bar.set_postfix(positions=summary["positions"])

    try:
        if use_ray:
            ray = init_ray()
            cpus = max(1.0, (os.cpu_count() or 1) / max(1, num_actors)) if not num_gpus else 1.0
            ds = ray.data.from_items(items, override_num_blocks=len(items)).map_batches(
                CollectorActor, batch_size=1, compute=ray.data.ActorPoolStrategy(size=num_actors), num_cpus=cpus,
                num_gpus=num_gpus,
                fn_constructor_kwargs=dict(cfg_json=cfg.to_json(), out=str(out), device=device,
                                           fail_after=fail_after))
            for row in ds.iter_rows():
                account(row)
        else:
            actor = CollectorActor(cfg.to_json(), str(out), device=device, fail_after=fail_after)
            for it in items:
                res = actor({k: [v] for k, v in it.items()})
                account({k: v[0] for k, v in res.items()})
    finally:
        bar.close()
    summary["wall_s"] = time.perf_counter() - t0
    manifest.update(finished_at=time.strftime("%Y-%m-%dT%H:%M:%S"), last_summary=summary)
    write_json_atomic(manifest, manifest_path)
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
    p.add_argument("--position-batch", type=int, default=16, help="roots expanded together in one batched draft forward")
    p.add_argument("--dist-every", type=int, default=1,
                   help="T > 0: log acceptance-length distributions at every k-th position (0 = never; each costs a verify forward)")
    p.add_argument("--dist-verify-size", type=int, default=60, help="T > 0: V of the tree whose acceptance-length distribution is logged")
    p.add_argument("--num-actors", type=int, default=1, help="Ray actors (one model copy each)")
    p.add_argument("--num-gpus", type=float, default=None, help="GPUs per actor (default: 1 if CUDA is present)")
    p.add_argument("--no-ray", action="store_true", help="run in-process (debugging)")
    add_device_dtype(p)
    p.add_argument("--out", default="data/logs", help="logs root (hive-partitioned Parquet)")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.set_defaults(func=_run_collect_cli)


def _run_collect_cli(args) -> int:
    import torch

    if args.temperature < 0:
        raise DraftGymError(f"temperature must be >= 0, got {args.temperature}")
    from pipeline.datasets import resolve_split
    from pipeline.target import resolve_dtype_name

    widths = parse_positive_ints(args.widths, "--widths")
    if args.max_depth < 1:
        raise DraftGymError("--max-depth must be >= 1")
    num_gpus = args.num_gpus if args.num_gpus is not None else (1.0 if torch.cuda.is_available() else 0.0)
    cfg = CollectConfig(model=args.model, head=args.head, dtype=resolve_dtype_name(args.dtype, args.device),
                        dataset=args.dataset,
                        split=resolve_split(args.dataset, args.split), n_prompts=args.n_prompts,
                        max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed,
                        widths=widths, max_depth=args.max_depth, position_batch=args.position_batch,
                        dist_every=args.dist_every, dist_verify_size=args.dist_verify_size)
    if args.head not in ("random", "default"):
        from pipeline.head import resolve_head_dir
        resolve_head_dir(args.head)
    s = run_collect(cfg, args.out, num_actors=args.num_actors, num_gpus=num_gpus, use_ray=not args.no_ray,
                    device=args.device)
    if args.json:
        print(json.dumps(s))
    else:
        rate = s["positions"] / s["wall_s"] if s["wall_s"] else 0.0
        print(f"collected {s['collected']} prompts ({s['skipped_done']} already done, {len(s['skipped'])} skipped), "
              f"{s['positions']} positions in {s['wall_s']:.1f} s ({rate:.1f} positions/s) -> {s['out']} "
              f"[run_key {s['run_key']}]")
        for line in s["skipped"][:5]:
            print(f"  skipped {line}")
    return 0


