"""A validate --batch-sizes run's full steps against the latency model, per B, method and step kind.

    .venv/bin/python docs/adhoc/batch_steps_vs_model.py REPORT_DIR LOGS

REPORT_DIR: the --out of `draftgym validate --batch-sizes` (its batch_steps table); LOGS: the root whose
newest fp32 profile the replay used. Each full step (active rows == B) is charged by the model at its
own longest-row context: D t_draft(W, c, B) + t_verify(V, c, B) + t_overhead(c, B). Prints the means
of the measured and modelled t_draft, t_verify and t_step (ms), and the step's error (log S3).
"""
import argparse
import glob

import numpy as np
import pyarrow.parquet as pq

from simulator.latency.model import LatencyModel


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("report_dir")
    ap.add_argument("logs")
    a = ap.parse_args(argv)
    lat = LatencyModel.from_logs(a.logs, dtype="float32")
    print("profile", lat.meta.get("profile_id"))
    for f in sorted(glob.glob(f"{a.report_dir}/batch_steps/**/*.parquet", recursive=True)):
        t = pq.read_table(f).to_pylist()
        for meth in sorted({r["method"] for r in t}):
            rs = [r for r in t if r["method"] == meth and r["active"] == r["batch"]]
            if not rs:
                continue
            B = rs[0]["batch"]
            for kind in sorted({r["kind"] for r in rs}):
                k = [r for r in rs if r["kind"] == kind]
                c = np.array([r["context_max"] for r in k])
                D = np.array([r["depth"] for r in k])
                W = np.array([max(1, r["width"]) for r in k])
                V = np.array([r["verify_size"] for r in k])
                md = np.array([float(lat.t_draft(w, cc, batch=B)) * d for w, cc, d in zip(W, c, D)])
                mv = np.array([float(lat.t_verify(v, cc, batch=B)) for v, cc in zip(V, c)])
                mo = np.array([float(lat.t_overhead(cc, batch=B)) for cc in c])
                dd = np.array([r["t_draft"] for r in k])
                dv = np.array([r["t_verify"] for r in k])
                ds = np.array([r["t_step"] for r in k])
                ms = md + mv + mo
                print(f"B={B:2d} {meth:9s} {kind:5s} n={len(k):3d} ctx_max={c.mean():6.0f} "
                      f"draft {1e3 * dd.mean():6.1f}/{1e3 * md.mean():6.1f}  verify {1e3 * dv.mean():6.1f}/{1e3 * mv.mean():6.1f}  "
                      f"step {1e3 * ds.mean():6.1f}/{1e3 * ms.mean():6.1f}  ({(ds.mean() / ms.mean() - 1) * 100:+.1f}%)")


if __name__ == "__main__":
    main()
