"""Print a `draftgym validate` report.json (batch 1) as the BENCHMARKS.md tables: speed and
sim-vs-real per method and dataset.

    .venv/bin/python docs/adhoc/report_table.py data/reports/NAME/report.json
"""
import argparse
import json


def table(rep: dict) -> str:
    """The report's tables, one per dataset, as Markdown."""
    runs = rep["config"]["runs"]

    def pct(v):
        return "-" if v is None else f"{100 * v:+.1f}%"

    def num(v, fmt="{:.3f}"):
        return "-" if v is None else fmt.format(v)

    lines = []
    for ds, e in rep["datasets"].items():
        sv = e.get("sim_vs_real", {}).get("methods", {})
        lines += ["", f"{ds} (grid-best {tuple(e.get('grid_best', ()))}; lossless {'yes' if e['lossless'] else 'NO'}):", ""]
        psf = e.get("sim_vs_real", {}).get("profile_speed_factor")
        if psf:
            lines += [f"(time-local clock: pooled profile x {psf['factor']:.3f} from {psf['cells']} cells)", ""]
        lines.append(f"| method | tokens/s (mean ± std, {runs} runs) | x AR | x grid-best | tau | controller % | tau error "
                     "| tokens/s error" + (" | tokens/s error, pooled profile |" if psf else " |"))
        lines.append("|---|---|---|---|---|---|---|---|" + ("---|" if psf else ""))
        for name, m in e["methods"].items():
            s = sv.get(name, {})
            if name == "ar" and "ar" in e.get("sim_vs_real", {}):
                s = e["sim_vs_real"]["ar"]
            lines.append(f"| {name} | {m['tokens_per_s']:.2f} ± {m['tokens_per_s_std']:.2f} | {num(m.get('speedup_vs_ar'))} | "
                         f"{num(m.get('speedup_vs_grid-best'))} | {num(m.get('tau'), '{:.2f}')} | "
                         f"{100 * m['controller_share']:.2f} | {pct(s.get('tau_rel_error'))} | "
                         f"{pct(s.get('tokens_per_s_rel_error'))} |"
                         + (f" {pct(s.get('tokens_per_s_rel_error_pooled'))} |" if psf else ""))
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("report", help="a validate report.json")
    with open(ap.parse_args(argv).report) as f:
        print(table(json.load(f)))


if __name__ == "__main__":
    main()
