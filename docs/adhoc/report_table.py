"""Print a validate report.json as the BENCHMARKS.md tables (speed + sim-vs-real per method).
Run: .venv/bin/python docs/adhoc/report_table.py data/reports/NAME/report.json"""
import json
import sys

rep = json.load(open(sys.argv[1]))
runs = rep["config"]["runs"]
for ds, e in rep["datasets"].items():
    sv = e.get("sim_vs_real", {}).get("methods", {})
    print(f"\n{ds} (grid-best {tuple(e.get('grid_best', ()))}; lossless {'yes' if e['lossless'] else 'NO'}):\n")
    print(f"| method | tokens/s (mean ± std, {runs} runs) | x AR | x grid-best | tau | controller % | tau error | tokens/s error |")
    print("|---|---|---|---|---|---|---|---|")
    for name, m in e["methods"].items():
        s = sv.get(name, {})
        tau = "-" if m["tau"] is None else f"{m['tau']:.2f}"
        te = "-" if s.get("tau_rel_error") is None else f"{100 * s['tau_rel_error']:+.1f}%"
        ve = "-" if "tokens_per_s_rel_error" not in s else f"{100 * s['tokens_per_s_rel_error']:+.1f}%"
        if name == "ar" and "ar" in e.get("sim_vs_real", {}):
            ve = f"{100 * e['sim_vs_real']['ar']['tokens_per_s_rel_error']:+.1f}%"
        print(f"| {name} | {m['tokens_per_s']:.2f} ± {m['tokens_per_s_std']:.2f} | {m['speedup_vs_ar']:.3f} | "
              f"{m['speedup_vs_grid-best']:.3f} | {tau} | {100 * m['controller_share']:.2f} | {te} | {ve} |")
