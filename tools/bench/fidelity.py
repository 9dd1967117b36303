"""Fidelity benchmark: the replay's decode tokens/s against real decoding, per method, on held-out prompts.

    python -m tools.bench.fidelity --dtypes float32,bfloat16 --out data/reports/bench/fidelity.json

Run it on a quiet machine: every figure is a timing. Per dtype, under --work/<dtype>, the commands a
user runs, each as its own process, one after the other:

    collect    the datasets' train split (grid-best is chosen there) and test split (decoded below:
               no method was chosen or trained on it), widths 1 and 10, in-process (--no-ray)
    profile    B = 1, 4, 16, widths 1 and 10, the closed batches' and the load trace's shapes, with
               the prefill (what validate --load-trace's replay prices)
    validate   B = 1: AR, the static EAGLE-3 default (8, 10, 60), grid-best and each --policy, with
               --profile-first --profile-interleave 1 (the demo's path)
    validate   --batch-sizes 4,16: closed batches of AR and --batch-shapes, --profile-interleave 1
    validate   --load-trace: a Poisson trace (--load-requests at --load-rate per s, seed 0) served up to
               16 rows by AR, --load-shapes, vLLM's example and SGLang's rules

Figures, one row per (setting, dataset, method): the raw error of the replay's decode tokens/s against
the device's, (replayed - real) / real, not anchored to anything measured in the same run:

    B = 1        sim-vs-real's tokens/s error (online/validate/sim_vs_real.py), beside it the
                 re-anchored error (the method replayed on its own decoded text: in bf16 a near-tie
                 sends decoding down another text than the logs', and the replay of the logs' text
                 then differs by the text, not the clock) and the clock on the method's own cycles
    B = 4, 16    the closed batch's replayed against held-B decode tokens/s (online/validate/batch.py),
                 with the clock on the method's own held steps
    load         the load replay's tokens/s against the device's (online/validate/load.py), with
                 the cost error (the clock on the device's own steps)

and per dtype: the mean absolute raw error, the largest, and how many rows are within 10 %. A
command that fails is named in the report with its last line; the rows it would have given are
missing, the others stay. Reruns in the same --work resume (collect and profile skip what exists).

`--repeatability RUN1/<dtype> RUN2/<dtype>` runs nothing: it sets two runs' real decode tokens/s side by
side, row by row. The tokens are the same in both, so what moves is the machine: no single run's replay
error can be trusted below that spread.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from pipeline.cliargs import DefaultsHelpFormatter
from pipeline.runtime.atomic import atomic_write_json

SETTINGS = ("b1", "batch", "load")


def _cmd(argv: list[str], log: list[dict]) -> bool:
    """One `draftgym` command as its own process; its wall time and exit go to `log`. True on exit 0
    (validate exits 1 on a lossless mismatch: its report is still read)."""
    cmd = [sys.executable, "-m", "online.cli", *argv]
    print("$ draftgym " + " ".join(argv), flush=True)
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    tail = [ln for ln in (p.stderr + p.stdout).splitlines() if ln.strip()][-1:] or [""]
    log.append({"command": "draftgym " + " ".join(argv), "rc": p.returncode, "wall_s": time.perf_counter() - t0,
                "last_line": tail[0][-300:]})
    print(f"  exit {p.returncode} [{log[-1]['wall_s']:.0f} s]" + (f": {tail[0][-200:]}" if p.returncode else ""), flush=True)
    return p.returncode == 0


def poisson_trace(n: int, rate: float, seed: int = 0) -> list[float]:
    """n arrival times (s) of a Poisson process at `rate` per second, the first at 0."""
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, n - 1)
    return [0.0] + np.cumsum(gaps).round(4).tolist()


def commands(a, dtype: str, work: Path) -> dict[str, list[str]]:
    """The argv of every command (module docstring) for one dtype."""
    logs, dt = str(work / "logs"), ["--dtype", dtype]
    common = ["--model", a.model, "--head", a.head]
    out = {}
    for ds in a.datasets.split(","):
        for split, n in (("train", a.train_prompts), ("test", a.n_prompts)):
            out[f"collect {ds} {split}"] = ["collect", *common, "--dataset", ds, "--split", split, "--n-prompts", str(n),
                                            "--max-new-tokens", str(a.max_new_tokens), "--widths", "1,10", "--out", logs,
                                            "--no-ray", "--no-progress", *dt]
    out["profile"] = ["profile", *common, "--batch-sizes", "1,4,16", "--widths", "1,10", "--verify-sizes",
                      "1,2,3,4,5,8,16,32,60", "--contexts", "64,256", "--repeats", "3", "--out", logs, "--no-progress", *dt]
    val = ["validate", *common, "--dataset", a.datasets, "--n-prompts", str(a.n_prompts), "--max-new-tokens",
           str(a.max_new_tokens), "--logs", logs, "--runs", "1", "--no-progress", *dt]
    pol = [x for p in a.policy for x in ("--policy", p)]
    out["b1"] = [*val, *pol, "--out", str(work / "b1"), "--profile-first", "--profile-verify-sizes", "1,2,4,8,16,32,60,100,240",
                 "--profile-contexts", "32,512", "--profile-repeats", "8", "--profile-interleave", "1"]
    out["batch"] = [*val, "--out", str(work / "batch"), "--batch-sizes", a.batch_sizes, "--shapes", a.batch_shapes,
                    "--profile-interleave", "1"]
    out["load"] = [*val, "--out", str(work / "load"), "--load-trace", str(work / "trace.json"), "--max-batch", "16",
                   "--shapes", a.load_shapes]
    return out


def b1_rows(rep: dict) -> list[dict]:
    rows = []
    for ds, e in rep["datasets"].items():
        svr = e.get("sim_vs_real") or {}
        if "ar" in svr:
            rows.append({"setting": "B = 1", "dataset": ds, "method": "ar", "raw": svr["ar"]["tokens_per_s_rel_error"],
                         "own_text": None, "clock": None, "real": svr["ar"].get("real_decode_tokens_per_s")})
        for name, s in (svr.get("methods") or {}).items():
            rows.append({"setting": "B = 1", "dataset": ds, "method": name, "raw": s["tokens_per_s_rel_error"],
                         "own_text": (s.get("reanchored") or {}).get("tokens_per_s_rel_error"),
                         "clock": (s.get("cost") or {}).get("step"), "real": s.get("real_decode_tokens_per_s")})
    return rows


def batch_rows(rep: dict) -> list[dict]:
    return [{"setting": f"B = {B}", "dataset": ds, "method": name, "raw": s.get("replay_rel_error"), "own_text": None,
             "clock": s.get("cost_rel_error"), "real": s.get("held_decode_tokens_per_s")}
            for ds, e in rep["datasets"].items() for B, by in e["by_batch"].items() for name, s in by.items()
            if s.get("replay_rel_error") is not None]


def load_rows(rep: dict) -> list[dict]:
    return [{"setting": "load", "dataset": ",".join(rep["config"]["datasets"]), "method": r["name"],
             "raw": (r.get("replay_rel_error") or {}).get("tokens_per_s"), "own_text": None,
             "clock": r.get("cost_rel_error"), "real": r.get("tokens_per_s")}
            for r in rep["rows"] if (r.get("replay_rel_error") or {}).get("tokens_per_s") is not None]


READERS = {"b1": b1_rows, "batch": batch_rows, "load": load_rows}


def work_rows(work: Path, settings=SETTINGS) -> list[dict]:
    """The rows of the validate reports a run left under one dtype's work folder."""
    rows = []
    for setting in settings:
        path = Path(work) / setting / "report.json"
        if path.is_file():
            rows += READERS[setting](json.loads(path.read_text()))
    return rows


def repeatability(work_a: Path, work_b: Path) -> dict:
    """Two runs of the benchmark (one dtype's work folders) on the same machine: how far real decoding
    moves between them, row by row, beside each run's replay error. Tokens and text are the same in both
    runs (the same logs, prompts and engine), so the real-against-real spread is the machine's own
    repeatability: a floor under any replay error that a single run can show."""
    a = {(r["setting"], r["dataset"], r["method"]): r for r in work_rows(work_a)}
    b = {(r["setting"], r["dataset"], r["method"]): r for r in work_rows(work_b)}
    rows = [{"setting": k[0], "dataset": k[1], "method": k[2], "real_a": a[k]["real"], "real_b": b[k]["real"],
             "real_rel": b[k]["real"] / a[k]["real"] - 1, "raw_a": a[k]["raw"], "raw_b": b[k]["raw"]}
            for k in a if k in b and a[k].get("real") and b[k].get("real")]
    by = {}
    for s in dict.fromkeys(r["setting"] for r in rows):
        rs = [r for r in rows if r["setting"] == s]
        real, raw = np.abs([r["real_rel"] for r in rs]), np.abs([[r["raw_a"], r["raw_b"]] for r in rs])
        by[s] = {"rows": len(rs), "real_mean_abs": float(real.mean()), "real_max_abs": float(real.max()),
                 "real_within_10pct": int((real <= 0.10).sum()), "replay_mean_abs": float(raw.mean())}
    return {"rows": rows, "by_setting": by}


def repeatability_table(rep: dict) -> str:
    out = ["| setting | rows | real run b / run a, mean abs | largest | within 10 % | replay error, mean abs (both runs) |",
           "|---|---|---|---|---|---|"]
    out += [f"| {s} | {v['rows']} | {100 * v['real_mean_abs']:.1f} % | {100 * v['real_max_abs']:.1f} % | "
            f"{v['real_within_10pct']} | {100 * v['replay_mean_abs']:.1f} % |" for s, v in rep["by_setting"].items()]
    return "\n".join(out)


def summary(rows: list[dict]) -> dict:
    e = np.array([abs(r["raw"]) for r in rows], np.float64)
    c = np.array([abs(r["clock"]) for r in rows if r["clock"] is not None], np.float64)
    return {"rows": len(rows), "mean_abs": float(e.mean()) if e.size else None, "max_abs": float(e.max()) if e.size else None,
            "within_10pct": int((e <= 0.10).sum()), "clock_mean_abs": float(c.mean()) if c.size else None}


def run_dtype(a, dtype: str) -> dict:
    from pipeline.runtime.fingerprint import environment_fingerprint

    work = Path(a.work) / dtype
    work.mkdir(parents=True, exist_ok=True)
    (work / "trace.json").write_text(json.dumps(poisson_trace(a.load_requests, a.load_rate)))
    cmds, log, rows = commands(a, dtype, work), [], []
    for name, argv in cmds.items():
        if name.startswith("collect") or name == "profile":
            _cmd(argv, log)
    for setting in SETTINGS:
        if setting not in a.settings.split(","):
            continue
        (work / setting / "report.json").unlink(missing_ok=True)        # read only this run's report
        _cmd(cmds[setting], log)
        rows += work_rows(work, (setting,))
    return {"dtype": dtype, "environment": environment_fingerprint("cpu", dtype), "commands": log, "rows": rows,
            "summary": summary(rows), "by_setting": {s: summary([r for r in rows if r["setting"] == s])
                                                     for s in dict.fromkeys(r["setting"] for r in rows)}}


def tables(report: dict) -> str:
    pct = lambda v: "-" if v is None else f"{100 * v:+.1f}%"
    out = []
    for run in report["runs"]:
        env, s = run["environment"], run["summary"]
        where = f"{env.get('cpu_model') or env.get('device')}, {run['dtype']}"
        out += [f"### Replayed against real decode tokens/s ({where}, {report['date']})", "",
                "| setting | dataset | method | raw error | own text | clock on its steps |", "|---|---|---|---|---|---|"]
        out += [f"| {r['setting']} | {r['dataset']} | {r['method']} | {pct(r['raw'])} | {pct(r['own_text'])} | {pct(r['clock'])} |"
                for r in run["rows"]]
        if s["rows"]:
            out += ["", f"{where}: {s['rows']} rows, mean |raw error| {100 * s['mean_abs']:.1f} %, largest "
                        f"{100 * s['max_abs']:.1f} %, {s['within_10pct']} within 10 %; per setting: "
                    + "; ".join(f"{k} {100 * v['mean_abs']:.1f} % (max {100 * v['max_abs']:.1f} %)"
                                for k, v in run["by_setting"].items())]
        failed = [c for c in run["commands"] if c["rc"] not in (0,)]
        out += [f"- exit {c['rc']}: `{c['command'][:80]}...`: {c['last_line']}" for c in failed] + [""]
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.bench.fidelity", description=__doc__.splitlines()[0],
                                 formatter_class=DefaultsHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m", help="target")
    ap.add_argument("--head", default="default", help="EAGLE-3 head")
    ap.add_argument("--datasets", default="mt-bench,humaneval", help="comma-separated prompt sets")
    ap.add_argument("--n-prompts", type=int, default=4, help="held-out (test split) prompts per dataset")
    ap.add_argument("--train-prompts", type=int, default=4, help="train-split prompts per dataset (grid-best)")
    ap.add_argument("--max-new-tokens", type=int, default=64, help="tokens per prompt")
    ap.add_argument("--policy", action="append", default=[], help="a policy checkpoint run at B = 1 (repeatable)")
    ap.add_argument("--batch-sizes", default="4,16", help="closed batch sizes")
    ap.add_argument("--batch-shapes", default="chain:2;tree:3,10,8", help="static shapes of the closed batches")
    ap.add_argument("--load-shapes", default="chain:2", help="static shapes served under the load trace")
    ap.add_argument("--load-requests", type=int, default=16, help="requests of the load trace")
    ap.add_argument("--load-rate", type=float, default=1.5, help="arrivals per second of the load trace")
    ap.add_argument("--settings", default=",".join(SETTINGS), help="which of b1, batch, load to run")
    ap.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated dtypes, each measured in turn")
    ap.add_argument("--work", default="data/reports/bench/fidelity", help="logs, profiles and validate reports")
    ap.add_argument("--out", default=None, help="write the JSON report here (default: print only)")
    ap.add_argument("--repeatability", nargs=2, metavar=("WORK_A", "WORK_B"), default=None,
                    help="run nothing: compare two earlier runs' work folders of one dtype (e.g. RUN1/bfloat16 "
                         "RUN2/bfloat16): real decoding's run-to-run spread beside the replay error")
    a = ap.parse_args(argv)
    if a.repeatability:
        missing = [w for w in a.repeatability if not Path(w).is_dir()]
        if missing:
            print(f"bench fidelity: error: work folder {missing[0]} not found", file=sys.stderr)
            return 2
        rep = repeatability(*map(Path, a.repeatability))
        if not rep["rows"]:
            print(f"bench fidelity: error: no row measured in both {a.repeatability[0]} and {a.repeatability[1]}", file=sys.stderr)
            return 2
        print(repeatability_table(rep))
        if a.out:
            atomic_write_json(rep, a.out)
        return 0
    bad = sorted(set(a.settings.split(",")) - set(SETTINGS))
    if bad:
        print(f"bench fidelity: error: unknown setting(s) {bad}; choose from {', '.join(SETTINGS)}", file=sys.stderr)
        return 2
    report = {"command": "python -m tools.bench.fidelity " + " ".join(argv if argv is not None else sys.argv[1:]),
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "config": vars(a), "runs": []}
    t0 = time.perf_counter()
    for dt in a.dtypes.split(","):
        report["runs"].append(run_dtype(a, dt))
    report["wall_s"] = time.perf_counter() - t0
    report["tables"] = tables(report)
    print(report["tables"])
    if a.out:
        atomic_write_json(report, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
