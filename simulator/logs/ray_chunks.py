"""Chunks of a `LogSource` as Ray tasks: `evaluate --ray` on one box or a cluster.

`map_chunks(src, fn, max_positions)` packs the source's shard groups into chunks exactly as
`LogSource.chunks` does and runs `fn(chunk)` for each as one Ray task (one CPU each); the task reads its
own shards (`LogSource.read`), so only the selection (sequences and config, put in the object store
once) and `fn`'s small per-sequence answers travel. Results come back in chunk order; callers put
sequences back in the logs' order by `source_index` (simulator.evaluate), so the figures equal one box's.

Ray is started as `draftgym collect` starts it (`pipeline.collect.cluster.init_ray`: embedded and local,
or RAY_ADDRESS with this checkout shipped as the job's runtime_env). The tasks open their shards by
path: logs on an object store (s3://, gs://) are read from the store by each task (the selection
carries the store: `simulator.logs.read.LogSelection.store`); local logs must be on a filesystem every
node mounts at the same path.
"""
from __future__ import annotations

from typing import Callable

from simulator.logs.stream import LogSource, pack_groups


def _run(src: LogSource, pack: list, scores: bool, fn: Callable):
    return fn(src.read(pack, scores))


def map_chunks(src: LogSource, fn: Callable, max_positions: int, scores: bool = True, desc: str = "chunks") -> list:
    from tqdm import tqdm

    from pipeline.collect.cluster import init_ray

    ray = init_ray()
    packs = list(pack_groups(src.groups, max_positions))
    src_ref = ray.put(src)
    task = ray.remote(num_cpus=1)(_run)
    pending = {task.remote(src_ref, pack, scores, fn): i for i, pack in enumerate(packs)}
    out = [None] * len(packs)
    bar = tqdm(total=sum(g.rows for p in packs for g in p), desc=f"{desc} (ray)", unit="pos", unit_scale=True,
               disable=not src.progress, mininterval=2)
    while pending:
        done, _ = ray.wait(list(pending), num_returns=1)
        i = pending.pop(done[0])
        out[i] = ray.get(done[0])
        bar.update(sum(g.rows for g in packs[i]))
    bar.close()
    return out
