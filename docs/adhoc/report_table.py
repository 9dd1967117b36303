"""Print a validate report.json as the BENCHMARKS.md tables (speed + sim-vs-real per method).
Run: .venv/bin/python docs/adhoc/report_table.py data/reports/NAME/report.json"""
import json
import sys

rep = json.load(open(sys.argv[1]))
runs = rep["config"]["runs"]
for ds, e in rep["datasets"].items():
    sv = e.get("sim_vs_real", {}).get("methods", {})
    print(f"\n{ds} (grid-best {tuple(e.get('grid_best', ()))}; lossless {'yes' if e['lossless'] else 'NO'}):\n")
    psf = e.get("sim_vs_real", {}).get("profile_speed_factor")
    if psf:
        print(f"(time-local clock: pooled profile x {psf['factor']:.3f} from {psf['cells']} cells)\n")
    print(f"| method | tokens/s (mean ± std, {runs} runs) | x AR | x grid-best | tau | controller % | tau error | tokens/s error"
          + (" | tokens/s error, pooled profile |" if psf else " |"))
    print("|---|---|---|---|---|---|---|---|" + ("---|" if psf else ""))
    pct = lambda v: "-" if v is None else f"{100 * v:+.1f}%"
    for name, m in e["methods"].items():
        s = sv.get(name, {})
        if name == "ar" and "ar" in e.get("sim_vs_real", {}):
            s = e["sim_vs_real"]["ar"]
        tau = "-" if m["tau"] is None else f"{m['tau']:.2f}"
        te = pct(s.get("tau_rel_error"))
        ve = pct(s.get("tokens_per_s_rel_error"))
        print(f"| {name} | {m['tokens_per_s']:.2f} ± {m['tokens_per_s_std']:.2f} | {m['speedup_vs_ar']:.3f} | "
              f"{m['speedup_vs_grid-best']:.3f} | {tau} | {100 * m['controller_share']:.2f} | {te} | {ve} |"
              + (f" {pct(s.get('tokens_per_s_rel_error_pooled'))} |" if psf else ""))
