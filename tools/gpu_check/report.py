"""The GPU check's reports: gpu_report.json (everything) and gpu_report.md (tables for BENCHMARKS.md).

The Markdown is laid out as a benchmark log file (docs/benchmarks/): a header line naming the machine and the
software, one summary table (step, status, result, wall time), then one table per step that ran.
Times are milliseconds; "break-even tau" is t_cycle / AR step (tools/gpu_check/latency.py).
"""
from __future__ import annotations

from pathlib import Path

from pipeline.runtime.atomic import atomic_write_json, atomic_write_text


def write_reports(report: dict, out: Path) -> None:
    atomic_write_json(report, Path(out) / "gpu_report.json")
    atomic_write_text(Path(out) / "gpu_report.md", render_markdown(report))


def _f(v, fmt="{:.2f}") -> str:
    return "-" if v is None else fmt.format(v)


def _table(header: list[str], rows: list[list]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + \
           ["| " + " | ".join(str(c) for c in r) + " |" for r in rows] + [""]


def _shape(s) -> str:
    return "(" + ", ".join(map(str, s)) + ")"


def summary_line(step: str, r: dict) -> str:
    """One cell: what the step found, in a few words."""
    if r.get("status") in ("skipped",) or (r.get("status") == "failed" and "traceback" in r):
        return r.get("reason") or ""
    if step == "tests":
        c = r.get("counts", {})
        return ", ".join(f"{v} {k}" for k, v in c.items()) + (" (collected only: dry run)" if r.get("collect_only") else "")
    if step == "lossless":
        bl = (r.get("batched") or {}).get("rows", [])
        return "; ".join(f"{_shape(s['shape'])}: {s['exact']} exact, {s['near-tie']} near-tie, {s['mismatch']} mismatch"
                         for s in r.get("shapes", [])) + (
            f"; batched engine at B = {', '.join(str(b) for b in sorted({x['B'] for x in bl}))}: "
            f"{sum(x['mismatch'] for x in bl)} mismatch in {sum(x['prompts'] for x in bl)} rows" if bl else "")
    if step == "latency":
        ar = [o for o in r.get("ops", []) if o["op"] == "ar_step"]
        cyc = r.get("cycles", [])
        parts = [f"AR step {o['median']:.2f} ms at context {o['context']}" for o in ar[:1]]
        parts += [f"{_shape(c['shape'])} cycle {_f(c['t_cycle'])} ms (break-even tau {_f(c['break_even_tau'])})"
                  for c in cyc if c["context"] == (ar[0]["context"] if ar else None)]
        spec = (r.get("spec_batch") or {}).get("rows", [])
        parts += [f"batched engine AR B={b['B']} {b.get('mode', 'eager')} {_f(b['ar']['t_step'])} ms"
                  + (f" ({_f(b['ar']['x_bound'])}x bound)" if b["ar"].get("x_bound") else "")
                  for b in spec if b["B"] == spec[0]["B"] and (b.get("ar") or {}).get("t_step")]
        col = r.get("collect") or {}
        if col.get("positions_per_s"):
            parts.append(f"collection {col['positions_per_s']:.1f} positions/s ({_f(col['x_online_ar'])}x online AR)")
        return "; ".join(parts)
    if step == "profile":
        ar = r.get("ar_ms") or {}
        return (f"{r.get('rows')} rows in {r.get('file')}, B = {', '.join(map(str, r.get('batch_levels', [])))}; "
                + ", ".join(f"AR B={b} {v:.2f} ms" for b, v in list(ar.items())[:1] + list(ar.items())[-1:])
                + f"; {r.get('remeasured', 0)} re-measured, {len(r.get('suspect') or [])} suspect")
    if step == "kernels":
        return "; ".join(f"{t['case']} {_f(t.get('wall_ms'), '{:.1f}')} ms" for t in r.get("traces", []))
    if step == "validate":
        return "; ".join(f"{ds}: {sum(e['lossless_counts'].values()) if e['lossless_counts'] else 0} outputs, "
                         f"{(e['lossless_counts'] or {}).get('mismatch', 0)} mismatch"
                         for ds, e in r.get("datasets", {}).items())
    if step == "serving":
        rows = r.get("rows", [])
        ar = next((x for x in rows if x["name"] == "AR"), None)
        best = max((x for x in rows if x["name"] != "AR"), key=lambda x: x["tokens_per_s"] or 0, default=None)
        n = sum(sum((x.get("lossless") or {}).values()) for x in rows)
        return (f"{len(rows)} methods x {r.get('runs')} runs over {r.get('trace', {}).get('requests')} requests; "
                + (f"best {best['name']} {best['tokens_per_s']:.1f} tokens/s = {_f(best['x_ar'])}x AR; " if best and ar else "")
                + f"{n} rows checked, {sum((x.get('lossless') or {}).get('mismatch', 0) for x in rows)} mismatch")
    return r.get("reason") or ""


def render_markdown(rep: dict) -> str:
    env, cfg = rep["environment"], rep["config"]
    target = "a tiny random Llama (dry run)" if cfg["target"] == "tiny" else "a random-weight Llama-3.1-8B-shaped target"
    lines = [f"### GPU check `{rep['run_id']}`: {rep.get('gpu') or env['device']}", "",
             f"Machine: **{env['device']}**; torch {env['torch']} (CUDA {env['cuda']}), transformers "
             f"{env['transformers']}, Python {env['python']}, {env['cpu_count']} CPU cores ({env['cpu_model']}); "
             f"commit {env['draftgym_commit']}. Budget {cfg['minutes']:g} min, wall {rep.get('wall_s', 0) / 60:.1f} min. "
             f"Command: `{cfg['command']}`.", ""]
    steps = rep["steps"]
    lines += _table(["step", "status", "result", "wall (s)"],
                    [[s, r["status"], summary_line(s, r), f"{r.get('wall_s', 0):.0f}"] for s, r in steps.items()])
    if "target_build_s" in rep:
        lines += [f"Target: {target}, {cfg['dtype']}, built on {cfg['device']} in {rep['target_build_s']:.1f} s; "
                  f"EAGLE-3 head random, draft vocabulary {cfg_draft_vocab(steps)}.", ""]
    lossless = steps.get("lossless", {})
    if lossless.get("shapes"):
        lines += [f"Lossless ({lossless['dtype']}, {lossless['new_tokens']} new tokens per prompt, random prompts of "
                  f"{', '.join(map(str, lossless['prompt_lens']))} tokens; pipeline/decode/lossless.py):", ""]
        lines += _table(["tree (D, W, V)", "prompts", "exact", "near-tie", "mismatch", "tau", "largest gap (ulps)"],
                        [[_shape(s["shape"]), s["prompts"], s["exact"], s["near-tie"], s["mismatch"], _f(s["tau"]),
                          _f(s["max_gap_ulps"], "{:.1f}")] for s in lossless["shapes"]])
    bl = lossless.get("batched") or {}
    if bl.get("rows"):
        g = bl.get("graphs") or {}
        lines += [f"Lossless, the batched engine ({bl['new_tokens']} new tokens a row, each row against the same "
                  f"engine's AR at B = 1; span bucket {bl['span_bucket']}; CUDA graphs "
                  + ("on, " + f"{g['captures']} captures" if g.get("cuda_graphs") else "off")
                  + (f", capture FAILED: {g['failure']}" if g.get("failure") else "") + "):", ""]
        lines += _table(["B", "tree (D, W, V)", "prompts", "exact", "near-tie", "mismatch", "largest gap (ulps)"],
                        [[r["B"], _shape(r["shape"]), r["prompts"], r["exact"], r["near-tie"], r["mismatch"],
                          _f(r["max_gap_ulps"], "{:.1f}")] for r in bl["rows"]])
    elif bl:
        lines += [f"Lossless, the batched engine: {bl.get('status')} ({bl.get('reason')}).", ""]
    lat = steps.get("latency", {})
    if lat.get("ops"):
        lines += [f"Latency at batch 1 on {lat['device']} (ms, median [p10, p90]; n timed calls):", ""]
        lines += _table(["op", "context", "W", "V", "median", "p10", "p90", "n"],
                        [[o["op"], o["context"], _f(o["W"], "{}"), _f(o["V"], "{}"), _f(o["median"], "{:.3f}"),
                          _f(o["p10"], "{:.3f}"), _f(o["p90"], "{:.3f}"), o["n"]] for o in lat["ops"]])
    bound = lat.get("weight_read_bound") or {}
    if bound.get("bound_ms"):
        ar = [o for o in lat.get("ops", []) if o["op"] == "ar_step" and o.get("x_bound")]
        lines += [f"Weight-read bound: {bound['weight_bytes'] / 1e9:.2f} GB of weights / {bound['bandwidth_tbs']:g} TB/s "
                  f"({bound['source']}) = **{bound['bound_ms']:.2f} ms** per step at batch 1; the AR step is "
                  + ", ".join(f"{o['x_bound']:.2f}x it at context {o['context']}" for o in ar) + ".", ""]
    elif bound:
        lines += [f"Weight-read bound: {bound['weight_bytes'] / 1e9:.3f} GB of weights; no bound ({bound['source']}).", ""]
    if lat.get("cycles"):
        lines += ["Whole cycles of static trees in real decoding (ms, medians; break-even tau = t_cycle / AR step):", ""]
        lines += _table(["tree (D, W, V)", "context", "cycles", "t_draft", "t_verify", "t_controller", "t_cycle",
                         "break-even tau"],
                        [[_shape(c["shape"]), c["context"], c["cycles"], _f(c["t_draft"]), _f(c["t_verify"]),
                          _f(c["t_controller"], "{:.3f}"), _f(c["t_cycle"]), _f(c["break_even_tau"])]
                         for c in lat["cycles"]])
    if lat.get("batch1_failure"):
        lines += [f"Batch-1 tables stopped: {lat['batch1_failure']}.", ""]
    arb = lat.get("ar_batch") or {}
    if arb.get("rows"):
        lines += ["AR decode step by batch size (`generate_batch`: collection's continuations, on the batched "
                  "engine's AR step; wall time per token, prefills excluded):", ""]
        lines += _table(["B", "context", "step (ms)", "tokens/s", "x weight-read bound"],
                        [[b["B"], b["context"], _f(b["step_ms"]), _f(b["tokens_per_s"], "{:.0f}"), _f(b.get("x_bound"))]
                         for b in arb["rows"]])
    elif arb:
        lines += [f"AR decode step by batch size: {arb.get('status')} ({arb.get('reason')}).", ""]
    col = lat.get("collect") or {}
    if col.get("status") == "ok":
        lines += [f"Collection on {lat['device']} (`collect_prompts` in-process: {col['prompts']} prompts of context "
                  f"{col['context']}, {col['new_tokens']} new tokens, W = {col['width']}, Dmax = {col['max_depth']}): "
                  f"{col['positions']} positions in {col['continuations_s'] + col['expand_s']:.2f} s "
                  f"(continuations {col['continuations_s']:.2f} s, teacher forcing and expansion {col['expand_s']:.2f} s), "
                  f"**{col['positions_per_s']:.1f} positions/s** = {_f(col['x_online_ar'])}x the online AR tokens/s at "
                  f"batch 1 ({_f(col['online_ar_tokens_per_s'], '{:.1f}')}).", ""]
    elif col:
        lines += [f"Collection: {col.get('status')} ({col.get('reason')}).", ""]
    spec = lat.get("spec_batch") or {}
    if spec.get("rows"):
        shapes = spec["shapes"]
        g = spec.get("graphs") or {}
        lines += ["Batched engine step by batch size (ms, median t_step; in brackets break-even tau = "
                  "t_step / AR's t_step; x bound = AR's t_step / the weight-read bound; AR timed / untimed = "
                  "the wall time of AR's call with the step's phase marks over the same call without; span bucket "
                  f"{spec.get('span_bucket', '-')}; mode graphs = replayed from CUDA graphs"
                  + (f", {g['captures']} captures in {_f(g['capture_s'])} s" if g.get("captures") is not None else "")
                  + (f", capture FAILED: {g['failure']}" if g.get("failure") else "") + "):", ""]
        lines += _table(["B", "mode"] + [s if s == "ar" else f"({s})" for s in shapes] + ["AR x bound", "AR timed / untimed"],
                        [[r["B"], r.get("mode", "eager")] + [_batch_cell(r.get(s)) for s in shapes]
                         + [_f((r.get("ar") or {}).get("x_bound")), _f((r.get("ar") or {}).get("timed_over_untimed"), "{:.3f}")]
                         for r in spec["rows"]])
    elif spec:
        lines += [f"Batched engine: {spec.get('status')} ({spec.get('reason')}).", ""]
    prof = steps.get("profile", {})
    if prof.get("verify_ms"):
        Vs = sorted({int(v) for row in prof["verify_ms"].values() for v in row})
        lines += [f"GPU latency profile `{prof['file']}` ({prof['profile_id']}, {prof['device']}; "
                  f"{prof['rows']} rows, contexts {', '.join(map(str, prof['contexts']))}): t_verify (ms) of the "
                  f"latency model at context {prof['context']} by batch size B and verify size V (V = 1: the AR step)"
                  + (f"; suspect cells left out: {'; '.join(prof['suspect'])}" if prof.get("suspect") else "") + ":", ""]
        lines += _table(["B"] + [f"V = {v}" for v in Vs],
                        [[b] + [_f(row.get(v, row.get(str(v)))) for v in Vs] for b, row in prof["verify_ms"].items()])
    for t in steps.get("kernels", {}).get("traces", []):
        if t.get("status") != "ok":
            lines += [f"Kernels, {t['case']}: {t.get('status')} ({t.get('reason')}).", ""]
            continue
        for by, what in (("by_device", "self device time"), ("by_cpu", "self CPU time")):
            if t[by]:
                lines += [f"Kernels, {t['case']} ({_f(t['wall_ms'], '{:.1f}')} ms wall, {t['ops']} distinct ops; "
                          f"tools/gpu_check/kernels.py): top ops by {what}:", ""]
                lines += _table(["op", "calls", "self device (ms)", "self CPU (ms)"],
                                [[o["op"][:60], o["calls"], _f(o["self_device_ms"], "{:.3f}"), _f(o["self_cpu_ms"], "{:.3f}")]
                                 for o in t[by]])
    val = steps.get("validate", {})
    if val.get("datasets"):
        lines += [f"`draftgym validate` on {val['device']}: {val['model']}, head {val['head']}, T = 0, 1 run"
                  + (f"; {val['policy_note']}" if val.get("policy_note") else "") + ":", ""]
        rows = []
        for ds, e in val["datasets"].items():
            for m, s in e["methods"].items():
                rows.append([ds, m, _f(s["tokens_per_s"], "{:.1f}"), _f(s.get("speedup_vs_ar")), _f(s.get("tau")),
                             _f(s.get("draft_calls_per_cycle"), "{:.1f}")])
        lines += _table(["dataset", "method", "tokens/s", "x AR", "tau", "draft calls/cycle"], rows)
        lines += ["Lossless per dataset (EAGLE-3 outputs vs AR): " + "; ".join(
            f"{ds}: " + ", ".join(f"{v} {k}" for k, v in (e["lossless_counts"] or {}).items())
            for ds, e in val["datasets"].items()), ""]
    lines += serving_section(steps.get("serving", {}))
    return "\n".join(lines)


def serving_section(r: dict) -> list[str]:
    """The serving step: its commands with their wall times, the tuned schedule, and per method the device's
    tokens/s against the replay's (the whole table, TPOT and queue times too, is serving_report.md)."""
    if not r.get("rows"):
        return []
    lines = [f"Serving under load on {r['device']} ({r['model']}, head {r['head']}, {r['dataset']}; "
             f"tools/gpu_check/serving.py), the commands run:", ""]
    lines += _table(["command", "wall (s)"], [[f"`{c['command']}`", f"{c['wall_s']:.1f}"] for c in r["commands"]])
    lines += [f"Profile {r['profile_id']} (`{r['profile_file']}`): AR step " + ", ".join(
                  f"{v:.2f} ms at B = {b}" for b, v in r["ar_ms"].items())
              + ". Tuned: " + ", ".join(f"B {t['batch']} -> {t['best']} ({_f(t['x_ar'])}x AR)" for t in r["tuned"])
              + f"; headroom shape {r['headroom']['shape']} (within {_f(r['headroom']['gap'], '{:.3f}')}x of every B's best)."
              + (f" {r['train_note']}." if r.get("train_note") else ""), "",
              f"`validate --load-trace`: {r['trace']['requests']} requests of the {r['served_split']} split over "
              f"{r['trace']['span_s']:.1f} s (tune and train-load fit on the {r['fit_split']} split"
              + ("; the same prompts: in-sample" if r["fit_split"] == r["served_split"] else "")
              + f"), {r['runs']} runs (mean +- std); replay of the same trace on the logs and the profile above:", ""]
    pct = lambda x: _f(x if x is None else 100 * x, "{:+.1f}")
    lines += _table(["method", "tokens/s", "x AR", "tau", "drafts/step", "mean B", "replay tokens/s (error)",
                     "error: cost / path %", "graphs captured", "lossless (exact / near-tie / mismatch)"],
                    [[x["name"], f"{_f(x['tokens_per_s'], '{:.1f}')} ± {_f(x['tokens_per_s_std'], '{:.1f}')}", _f(x["x_ar"]),
                      _f(x["tau"]), _f(x["drafts_per_step"]), _f(x["mean_batch"]),
                      f"{_f(x['replay_tokens_per_s'], '{:.1f}')} ({pct(x['replay_error'])} %)",
                      f"{pct(x.get('cost_error'))} / {pct(x.get('path_error'))}", _f(x.get("graph_captures"), "{:.0f}"),
                      " / ".join(str((x.get("lossless") or {}).get(k, "-")) for k in ("exact", "near-tie", "mismatch"))]
                     for x in r["rows"]])
    lines += ["cost / path: the replay's error in two parts (docs/serving.md): the profile's price of the steps the "
              "device ran against their measured time, and the error left had every step been priced right.", ""]
    return lines + [line for k in ("replay_note", "prefill_note") if r.get(k) for line in (f"note: {r[k]}", "")]


def cfg_draft_vocab(steps: dict):
    for s in ("lossless", "latency"):
        if "head_draft_vocab" in steps.get(s, {}):
            return steps[s]["head_draft_vocab"]
    return "-"


def _batch_cell(c: dict | None) -> str:
    if not c:
        return "-"
    return _f(c["t_step"]) + (f" [{_f(c.get('break_even_tau'))}]" if "break_even_tau" in c else "")
