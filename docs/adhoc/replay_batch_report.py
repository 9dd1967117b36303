"""Re-run the simulator side of a `draftgym validate --batch-sizes` report: the closed-batch replay of
each (B, method) against the held-B figures the report measured, with the profile the report names
(its time-local profile under REPORT_DIR when it ran with --profile-interleave), then report.json
and report.md rewritten. For a report written before the replay gained a column (log T2: the
replayed tau, against the held-B tau, which this script adds from the report's step tables when the
report lacks it). Deterministic: the same logs and profile give the same replay.

    .venv/bin/python docs/adhoc/replay_batch_report.py REPORT_DIR
"""
import json
import sys
from pathlib import Path

import pyarrow.parquet as pq

from online.validate import ValidateConfig, load_acceptance_logs, load_prompt_sets
from online.validate_batch import batch_methods, replay_side
from online.validate_batch_report import write_batch_markdown
from simulator.latency_model import LatencyModel

out = Path(sys.argv[1])
rep = json.loads((out / "report.json").read_text())
cfg = ValidateConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in rep["config"].items()})
logs, _ = load_acceptance_logs(cfg, rep["dtype"])
pi = rep.get("profile_interleave")
lat = LatencyModel.from_logs(out if pi else cfg.logs, model=logs.model, device=rep["device"], dtype=rep["dtype"],
                             profile=pi["profile_id"] if pi else None)
clocks = {"": lat}
if pi:                                                      # the second column: the logs' own profile
    clocks["_logs_profile"] = LatencyModel.from_logs(cfg.logs, model=logs.model, device=rep["device"],
                                                     dtype=rep["dtype"], profile=pi["from_profile"])
sets, methods = load_prompt_sets(cfg), batch_methods(cfg)


def held_tau(steps: list[dict], B: int) -> float:
    """tau over each run's leading steps while the batch is full (online/validate_batch.held_window)."""
    tok = rs = 0
    for run in sorted({r["run"] for r in steps}):
        for r in sorted((r for r in steps if r["run"] == run), key=lambda r: r["step"]):
            if r["batch"] != B:
                break
            tok, rs = tok + r["emitted_sum"], rs + B
    return tok / rs


for ds, e in rep["datasets"].items():
    for B, by_method in e["by_batch"].items():
        steps = pq.read_table(e["step_tables"][B]).to_pylist()
        for name, s in by_method.items():
            s.setdefault("held_tau", held_tau([r for r in steps if r["method"] == name], int(B)))
    e["replay"] = replay_side(cfg, logs, clocks, sets[ds], methods, e["by_batch"])
(out / "report.json").write_text(json.dumps(rep, indent=1))
write_batch_markdown(rep, out)
print(f"replayed with {lat.meta['profile_id']}: {out / 'report.md'}")
