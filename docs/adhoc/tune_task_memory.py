"""One `tune --ray` task measured alone: the first chunk of a split read as a task reads it
(acceptance only), then `tune_part` at B = 1, 4, 16, 64 over the logged trees; prints positions,
read and replay seconds and the process's peak RSS. Log: docs/benchmarks/2026-11-27-tune-on-ray.md.

    PYTHONPATH=. .venv/bin/python docs/adhoc/tune_task_memory.py LOGS [MAX_POSITIONS]

LOGS: logs written by `python -m online.bench.scale --phases write,tune` (the tune phase writes the
synthetic batched profile under LOGS/_bench_tune).
"""
import json
import resource
import sys
import time

from simulator.latency_model import LatencyModel
from simulator.logs.stream import LogSource, pack_groups
from simulator.serving import shapes as S
from simulator.serving.tune import tune_part

root = sys.argv[1]
budget = int(sys.argv[2]) if len(sys.argv) > 2 else 500_000
lat = LatencyModel.from_logs(root + "/_bench_tune")
src = LogSource(root, split="train", widths="all", progress=False)
pack = next(iter(pack_groups(src.groups, budget)))
t0 = time.perf_counter()
chunk = src.read(pack, False)
t1 = time.perf_counter()
part = tune_part(chunk, lat, [1, 4, 16, 64], S.candidates(chunk, "tree"))
t2 = time.perf_counter()
print(json.dumps({"positions": int(chunk.n_positions), "sequences": part["sequences"], "read_s": round(t1 - t0, 1),
                  "replay_s": round(t2 - t1, 1),
                  "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6, 2)}))
