"""The Markdown + PNG report of `draftgym validate --batch-sizes` (report.md and
tokens_per_s_vs_batch.png; the figures' definitions are in online/validate/batch.py)."""
from __future__ import annotations

from pathlib import Path

HEADER = ("| method | shape | tokens/s (mean ± std over runs) | per-request tokens/s | x AR | tau | drafts/step | "
          "lossless (exact / near-tie / mismatch) | held-B decode tokens/s | replayed tokens/s | replay error | "
          "replayed tau (error) | clock on its steps |")


SECOND = " replayed tokens/s, the logs' profile | its error |"


def _num(v, fmt="{:.2f}") -> str:
    return "-" if v is None else fmt.format(v)


def method_row(name: str, s: dict, second: bool = False) -> str:
    c = s.get("lossless")
    lossless = f"{c['exact']} / {c['near-tie']} / {c['mismatch']}" if c else "-"
    pct = lambda e: "-" if e is None else f"{100 * e:+.1f}%"
    return (f"| {name} | {s['shape']} | {s['tokens_per_s']:.2f} ± {s['tokens_per_s_std']:.2f} | "
            f"{_num(s['per_request_tokens_per_s'])} | {_num(s['speedup_vs_ar'])} | {_num(s['tau'])} | "
            f"{_num(s['drafts_per_step'])} | {lossless} | {_num(s['held_decode_tokens_per_s'])} | "
            f"{_num(s.get('replayed_tokens_per_s'))} | {pct(s.get('replay_rel_error'))} | "
            f"{_num(s.get('replayed_tau'))} ({pct(s.get('replay_tau_rel_error'))}) | {pct(s.get('cost_rel_error'))} |"
            + (f" {_num(s.get('replayed_tokens_per_s_logs_profile'))} | {pct(s.get('replay_rel_error_logs_profile'))} |"
               if second else ""))


def dataset_section(ds: str, e: dict, dtype: str) -> list[str]:
    cnt = e.get("lossless_counts")
    lines = [f"## {ds}", "", f"lossless: **{'yes' if e['lossless'] else 'NO'}**"
             + (f" (every row against its own batch-1 AR output, {dtype}: {cnt['exact']} exact, "
                f"{cnt['near-tie']} near-tie, {cnt['mismatch']} mismatch)" if cnt
                else " (T > 0: not checked token by token)"), ""]
    for B, by_method in e["by_batch"].items():
        first = next(iter(by_method.values()))
        second = any("replay_rel_error_logs_profile" in s for s in by_method.values())
        header = HEADER + (SECOND if second else "")
        lines += [f"### B = {B} ({first['requests']} requests; the batch held {first['held_batch']} rows while the queue lasted)",
                  "", header, "|" + "---|" * header.count(" | ") + "---|"]
        lines += [method_row(name, s, second) for name, s in by_method.items()]
        divs = [(name, d) for name, s in by_method.items() for d in s.get("divergences", [])]
        if divs:
            lines += ["", "Divergences from batch-1 AR (pipeline/decode/lossless.py):", "",
                      "| method | run | request | prompt | status | k | AR token | token | gap (ulps) |",
                      "|---|---|---|---|---|---|---|---|---|"]
            lines += [f"| {n} | {d['run']} | {d['request']} | {d['prompt_id']} | {d['status']} | {_num(d['k'], '{}')} | "
                      f"{_num(d['ar_token'], '{}')} | {_num(d['spec_token'], '{}')} | {_num(d['gap_ulps'], '{:.1f}')} |"
                      for n, d in divs[:20]]
            if len(divs) > 20:
                lines.append(f"\n({len(divs) - 20} more in report.json)")
        lines.append("")
    rp = e.get("replay")
    if rp:
        if rp.get("note"):
            lines.append(f"replay: {rp['note']}")
        for name, why in rp.get("not_replayable", {}).items():
            lines.append(f"- not replayed: {name}: {why}")
        for B, why in rp.get("batch", {}).items():
            lines.append(f"- not replayed at B = {B}: {why}")
        if rp.get("missing_prompts"):
            lines.append(f"- not in the logs, so not in the replay: {', '.join(rp['missing_prompts'])}")
        lines.append("")
    if e.get("step_tables"):
        lines += ["Step tables (schema batch_steps): " + ", ".join(f"B = {B}: `{p}`" for B, p in e["step_tables"].items()), ""]
    return lines


def plot_tokens_per_s(rep: dict, path: Path) -> None:
    """Total tokens/s against B, one line per method, one panel per dataset."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dss = rep["datasets"]
    fig, axes = plt.subplots(1, len(dss), figsize=(5 * len(dss), 3.8), squeeze=False)
    for ax, (ds, e) in zip(axes[0], dss.items()):
        bs = [int(B) for B in e["by_batch"]]
        for name in rep["methods"]:
            ax.plot(bs, [e["by_batch"][str(B)][name]["tokens_per_s"] for B in bs], marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_xticks(bs, [str(B) for B in bs])
        ax.set_xlabel("batch size B")
        ax.set_ylabel("tokens/s (all rows)")
        ax.set_title(f"{ds}: tokens/s against B ({rep['dtype']})")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_batch_markdown(rep: dict, out: Path) -> None:
    """report.md and tokens_per_s_vs_batch.png under out."""
    cfg = rep["config"]
    lines = [f"# DraftGym validation at batch sizes {', '.join(map(str, rep['batch_sizes']))} `{rep['run_id']}`", "",
             f"- device: **{rep['device']}** (CPU {rep['environment'].get('cpu_model') or '?'}); dtype **{rep['dtype']}**; "
             f"model `{cfg['model']}`, head `{rep['head_id']}`; T = {cfg['temperature']}; {cfg['runs']} runs; "
             f"{cfg['n_prompts']} prompts per dataset ({cfg['split'] or 'default'} split), cycled to max(N, 2B) "
             f"requests at each B; {cfg['max_new_tokens']} new tokens",
             f"- methods: {', '.join(rep['methods'])}"
             + (f"; schedule `{cfg['schedule']}`: " + ", ".join(f"B {b}: {s}" for b, s in rep["schedule"])
                if rep.get("schedule") else ""),
             f"- torch {rep['environment']['torch']}, transformers {rep['environment']['transformers']}; "
             f"wall {rep['wall_s']:.0f} s",
             "- tokens/s: all new tokens / the call's wall (prefills and the drain included); per-request: a "
             "request's decode tokens over its span on the step timeline; held-B decode: tokens / step time while "
             "the batch was full (what the closed-batch replay predicts); definitions in online/validate/batch.py",
             ""]
    if rep.get("replay_note"):
        lines += [f"replay: {rep['replay_note']}", ""]
    pi = rep.get("profile_interleave")
    if pi:
        lines += [f"replay timed with the time-local profile `{pi['profile_id']}` (--profile-interleave "
                  f"{pi['rounds']}: {pi['slices']} slices at contexts {', '.join(map(str, pi['contexts']))}, "
                  f"{pi['seconds']:.0f} s, one before each method's generation at each run and B; "
                  f"online/validate/interleave.py); the last two columns replay with the logs' profile "
                  f"`{pi['from_profile']}`", ""]
    lines += ["![tokens/s against B](tokens_per_s_vs_batch.png)", ""]
    for ds, e in rep["datasets"].items():
        lines += dataset_section(ds, e, rep["dtype"])
    plot_tokens_per_s(rep, out / "tokens_per_s_vs_batch.png")
    (out / "report.md").write_text("\n".join(lines) + "\n")
