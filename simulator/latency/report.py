"""`draftgym latency-report`: how well the latency model of a logs root fits its profile (leave-one-out
errors per op), RADAR's constants at context 512, and optionally a plot of points and curves."""
from __future__ import annotations

import json
from dataclasses import dataclass

from simulator.latency.model import LatencyModel


@dataclass
class LatencyReportConfig:
    """`draftgym latency-report`: the fit report (and plot) of the latency model of a logs root."""

    logs: str = ""                  # logs root holding latency/ (required)
    model: str | None = None        # model partition; None: the only one
    profile: str | None = None      # latency profile_id; None: the newest
    plot: str | None = None         # write a PNG of measured points and interpolated curves here; None: no plot
    as_json: bool = False           # print one JSON object


def run_latency_report_command(cfg: LatencyReportConfig) -> int:
    lat = LatencyModel.from_logs(cfg.logs, model=cfg.model, profile=cfg.profile)
    rep = lat.fit_report()
    rep["radar_constants_ctx512"] = dict(zip(("T0", "Tf", "Teye"), lat.radar_constants(512)))
    if cfg.plot:
        lat.plot(cfg.plot)
        rep["plot"] = cfg.plot
    if cfg.as_json:
        print(json.dumps(rep))
        return 0
    print(f"latency profile {rep['profile']} ({rep['device']})")
    for op, r in rep["ops"].items():
        if "points" in r:
            loo = "n/a" if r["loo_mean_rel_err"] is None else f"{100 * r['loo_mean_rel_err']:.2f}% mean, " \
                                                              f"{100 * r['loo_max_rel_err']:.2f}% max"
            print(f"  {op:10s} {r['points']:4d} points, x {r['x_range']}, ctx {r['ctx_range']}, "
                  f"leave-one-out error {loo}")
        else:
            print(f"  {op:10s} {1e3 * r['median_s']:.3f} ms per call")
    c = rep["radar_constants_ctx512"]
    print(f"  RADAR at ctx 512: T0 {1e3 * c['T0']:.2f} ms, Tf {1e3 * c['Tf']:.2f} ms, Teye {1e3 * c['Teye']:.3f} ms")
    return 0
