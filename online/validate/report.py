"""The Markdown + PNG report of `draftgym validate` (report.md, speedup.png, sim_vs_real.png)."""
from __future__ import annotations

from pathlib import Path


def write_markdown(rep: dict, out: Path) -> None:
    """report.md plus speedup.png and sim_vs_real.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cfg = rep["config"]
    lines = [f"# DraftGym validation `{rep['run_id']}`", "",
             f"- device: **{rep['device']}**; model `{cfg['model']}`, head `{rep['head_id']}`; T = {cfg['temperature']}; "
             f"{cfg['runs']} runs x {cfg['n_prompts']} prompts per dataset ({cfg['split'] or 'default'} split), "
             f"{cfg['max_new_tokens']} new tokens",
             f"- torch {rep['environment']['torch']}, transformers {rep['environment']['transformers']}; wall {rep['wall_s']:.0f} s",
             ""]
    if rep.get("latency_profile"):
        lp = rep["latency_profile"]
        pf = rep.get("profile_first")
        lines.insert(-1, f"- latency profile `{lp['profile_id']}` from `{lp['root']}`"
                     + (f" (pooled over {rep['profile_interleave']['rounds']} rounds: one right before decoding, "
                        f"{pf['wall_s']:.0f} s, the rest spread between the generations, --profile-interleave)"
                        if rep.get("profile_interleave") else
                        f" (taken right before decoding, --profile-first: {pf['wall_s']:.0f} s)" if pf else "")
                     + f"; cells priced at their {lp.get('point', 'mean')} (simulator/latency/estimate.py)")
        if lp.get("trust_note"):
            lines.insert(-1, f"- {lp['trust_note']}")
    if rep.get("logs_dtype") and rep["logs_dtype"] != rep.get("dtype"):
        lines.insert(-1, f"- acceptance logs in **{rep['logs_dtype']}**, decoding and profile in **{rep['dtype']}** "
                         f"(--logs-dtype: the transfer setting; sim-vs-real's tau error is what reusing the logs costs)")
    header_len = len(lines)
    fig, axes = plt.subplots(1, len(rep["datasets"]), figsize=(5 * len(rep["datasets"]), 3.6), squeeze=False)
    for ax, (ds, e) in zip(axes[0], rep["datasets"].items()):
        cnt = e.get("lossless_counts")
        lines += [f"## {ds}", "", f"lossless: **{'yes' if e['lossless'] else 'NO'}**"
                  + ("" if e["lossless_checked"] else " (T > 0: not checked token by token)")
                  + (f" (EAGLE-3 generations vs AR: {cnt['exact']} exact, {cnt['near-tie']} near-tie, "
                     f"{cnt['mismatch']} mismatch)" if cnt else "")
                  + (f"; grid-best static (D, W, V) = {tuple(e['grid_best'])}" if "grid_best" in e else ""), ""]
        if e.get("divergences"):
            lines += [f"Divergences from AR in {rep.get('dtype', '?')} (near-tie: at the first differing token k the AR "
                      "logits of the two tokens are within the dtype's rounding tolerance; pipeline/decode/lossless.py):", "",
                      "| method | run | prompt | status | k | AR token | EAGLE-3 token | gap (logits) | gap (ulps) | tolerance |",
                      "|---|---|---|---|---|---|---|---|---|---|"]
            num = lambda v, fmt: "-" if v is None else fmt.format(v)
            for d in e["divergences"][:20]:
                lines.append(f"| {d['method']} | {d['run']} | {d['prompt_id']} | {d['status']} | {num(d['k'], '{}')} | "
                             f"{num(d['ar_token'], '{}')} | {num(d['spec_token'], '{}')} | {num(d['gap'], '{:.4f}')} | "
                             f"{num(d['gap_ulps'], '{:.1f}')} | {num(d['tol'], '{:.4f}')} |")
            if len(e["divergences"]) > 20:
                lines.append(f"\n({len(e['divergences']) - 20} more in report.json)")
            lines.append("")
        lines += [
                  "| method | tokens/s (mean ± std over runs) | x AR | x static | x grid-best | tau | draft calls/cycle | controller % |",
                  "|---|---|---|---|---|---|---|---|"]
        for name, s in e["methods"].items():
            f = lambda k, fmt="{:.2f}": fmt.format(s[k]) if s.get(k) is not None else "-"
            lines.append(f"| {name} | {s['tokens_per_s']:.2f} ± {s['tokens_per_s_std']:.2f} | {f('speedup_vs_ar')} | "
                         f"{f('speedup_vs_static')} | {f('speedup_vs_grid-best')} | {f('tau')} | "
                         f"{f('draft_calls_per_cycle')} | {100 * s['controller_share']:.2f} |")
        names = list(e["methods"])
        ax.bar(names, [e["methods"][n]["speedup_vs_ar"] for n in names], color="tab:blue")
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_title(f"{ds}: speedup vs AR")
        ax.tick_params(axis="x", rotation=45)
        svr = e.get("sim_vs_real", {})
        if svr.get("methods"):
            psf = svr.get("profile_speed_factor")
            pct = lambda v: "-" if v is None else f"{100 * v:+.1f}%"
            # re-anchored (online/validate/reanchor.py): each method also replayed on its own decoded text; its
            # cells read "logs / re-anchored"
            ra = any("sim_tau" in s.get("reanchored", {}) for s in svr["methods"].values())
            two = " (logs / re-anchored)" if ra else ""
            lines += ["", "Sim vs real (cycle-only quantities; error = (sim - real) / real; AR-anchored: the simulated "
                      "tokens/s scaled by the machine speed factor = real / simulated AR decode tokens/s"
                      + (f"; clock: the pooled profile x {psf['factor']:.3f}, the speed its {psf['cells']} cells "
                         "sampled during this dataset's decoding showed; 'pooled': the unscaled pooled profile's error"
                         if psf else "")
                      + ("; logs: replayed on the logged text, re-anchored: on the method's own decoded text "
                         f"({svr['reanchored']['texts']} distinct texts teacher-forced in "
                         f"{svr['reanchored']['collect_s']:.1f} s), so the re-anchored error is the simulator's alone, "
                         "the difference is the text's" if ra else "") + "):", "",
                      f"| method | tau sim{two} | tau real | tau error{two} | decode tok/s sim{two} | decode tok/s real | "
                      f"tok/s error{two} " + ("| tok/s error, pooled " if psf else "") + "| tok/s error, AR-anchored |",
                      "|---|---|---|---|---|---|---|" + ("---|" if psf else "") + "---|"]
            if "ar" in svr:
                a = svr["ar"]
                lines.append(f"| ar | - | - | - | {a['sim_decode_tokens_per_s']:.2f} | {a['real_decode_tokens_per_s']:.2f} | "
                             f"{pct(a['tokens_per_s_rel_error'])} | "
                             + (f"{pct(a.get('tokens_per_s_rel_error_pooled'))} | " if psf else "")
                             + f"(factor {svr['machine_speed_factor']:.3f}) |")
            for name, s in svr["methods"].items():
                r = s.get("reanchored", {})
                both = lambda k, f: f(s[k]) + (f" / {'-' if r.get(k) is None else f(r[k])}" if ra else "")
                lines.append(f"| {name} | {both('sim_tau', '{:.3f}'.format)} | {s['real_tau']:.3f} | "
                             f"{both('tau_rel_error', pct)} | {both('sim_decode_tokens_per_s', '{:.2f}'.format)} | "
                             f"{s['real_decode_tokens_per_s']:.2f} | {both('tokens_per_s_rel_error', pct)} | "
                             + (f"{pct(s.get('tokens_per_s_rel_error_pooled'))} | " if psf else "")
                             + f"{pct(s.get('tokens_per_s_rel_error_ar_anchored'))} |")
            lines += ["", "Per-cycle time components, ms (sim / real):", "",
                      "| method | draft | verify | policy | overhead |", "|---|---|---|---|---|"]
            for name, s in svr["methods"].items():
                c = s["per_cycle_ms"]
                lines.append(f"| {name} | " + " | ".join(
                    f"{c['sim'].get(k, float('nan')):.1f} / {c['real'].get(k, float('nan')):.1f}"
                    for k in ("draft", "verify", "policy", "overhead")) + " |")
            lines += clock_lines(svr, pct)
            if svr.get("reanchored", {}).get("note"):
                lines.append(f"\n(re-anchored sim-vs-real: {svr['reanchored']['note']})")
            if svr.get("missing_prompts"):
                lines.append(f"\n(not in the logs, left out of sim-vs-real: {', '.join(svr['missing_prompts'])})")
        elif svr.get("note"):
            lines += ["", f"sim-vs-real: {svr['note']}"]
        lines.append("")
    fig.tight_layout()
    fig.savefig(out / "speedup.png", dpi=110)
    plt.close(fig)
    pts = [(s["sim"], s["real"], name) for e in rep["datasets"].values()
           for name, m in e.get("sim_vs_real", {}).get("methods", {}).items() for s in m["per_prompt"]]
    if pts:
        fig, ax = plt.subplots(figsize=(4.5, 4.2))
        for name in sorted({p[2] for p in pts}):
            xs = [p for p in pts if p[2] == name]
            ax.scatter([p[1] for p in xs], [p[0] for p in xs], label=name, s=18)
        lim = max(max(p[0], p[1]) for p in pts) * 1.1
        ax.plot([0, lim], [0, lim], "k--", lw=0.8)
        ax.set_xlabel("measured decode tokens/s")
        ax.set_ylabel("simulated decode tokens/s")
        ax.legend(fontsize=7)
        ax.set_title("sim vs real, per prompt")
        fig.tight_layout()
        fig.savefig(out / "sim_vs_real.png", dpi=110)
        plt.close(fig)
        lines += ["![sim vs real](sim_vs_real.png)", ""]
    lines.insert(header_len, "![speedup](speedup.png)\n")
    (out / "report.md").write_text("\n".join(lines) + "\n")


def clock_lines(svr: dict, pct) -> list[str]:
    """The clock alone (online/validate/sim_vs_real.py): decoding's own cycles priced by the clock, and the
    raw tokens/s error with the cells priced at each statistic."""
    lines = ["", "The clock on decoding's own cycles (each cycle priced at its D, W, V, c; error = (priced - "
             "measured) / measured):", "", "| method | cycles | step | draft | verify | verify by V |", "|---|---|---|---|---|---|"]
    for name, s in svr["methods"].items():
        c = s.get("cost") or {}
        if c:
            by_v = ", ".join(f"{v}: {pct(e)}" for v, e in c["verify_by_V"].items())
            lines.append(f"| {name} | {c['cycles']} | {pct(c['step'])} | {pct(c['draft'])} | {pct(c['verify'])} | {by_v} |")
    bp = svr.get("by_point")
    if bp and any(bp.values()):
        names = list(next(iter(bp.values())))
        lines += ["", "Raw decode tokens/s error by the cell statistic the clock prices (simulator/latency/estimate.py; "
                  "the first is the default):", "", "| point | " + " | ".join(names) + " | mean abs |",
                  "|---" * (len(names) + 2) + "|"]
        for p, errs in bp.items():
            vals = [errs.get(n) for n in names]
            mae = sum(abs(v) for v in vals if v is not None) / max(1, sum(v is not None for v in vals))
            lines.append(f"| {p} | " + " | ".join(pct(v) for v in vals) + f" | {100 * mae:.1f}% |")
    return lines
