"""One `tune --ray` task measured alone: the first chunk of a split read as a task reads it
(acceptance only), then `tune_part` at B = 1, 4, 16, 64 over the logged trees; prints positions,
read and replay seconds and the process's peak RSS. Log: docs/benchmarks/2026-11-27-tune-on-ray.md.

    PYTHONPATH=. .venv/bin/python docs/adhoc/tune_task_memory.py LOGS [MAX_POSITIONS]

LOGS: logs written by `python -m tools.bench.scale --phases write,tune` (the tune phase writes the
synthetic batched profile under LOGS/_bench_tune).
"""
import argparse
import json
import resource
import time

from pipeline.decode import step_shape
from simulator.latency.model import LatencyModel
from simulator.logs.stream import LogSource, pack_groups
from simulator.serving.inputs import candidates
from simulator.serving.tune import tune_part


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("logs")
    ap.add_argument("max_positions", nargs="?", type=int, default=500_000, help="positions in the chunk, at most")
    a = ap.parse_args(argv)
    lat = LatencyModel.from_logs(a.logs + "/_bench_tune")
    src = LogSource(a.logs, split="train", widths="all", progress=False)
    pack = next(iter(pack_groups(src.groups, a.max_positions)))
    t0 = time.perf_counter()
    chunk = src.read(pack, False)
    t1 = time.perf_counter()
    part = tune_part(chunk, lat, [1, 4, 16, 64], candidates(chunk, "tree"))
    t2 = time.perf_counter()
    res = {"positions": int(chunk.n_positions), "sequences": part["sequences"], "read_s": round(t1 - t0, 1),
           "replay_s": round(t2 - t1, 1),
           "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6, 2)}
    print(json.dumps(res))
    return res


if __name__ == "__main__":
    main()
