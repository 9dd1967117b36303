"""A draft head's history across warm starts: the held-out accuracy curve of every run behind it.

A head trained in several runs (each `draftgym train-draft --init-from PARENT` is a new run with its
own data, optimizer and schedule) records in its manifest `lineage`: the parent's own lineage, then
one entry for the parent. Each entry keeps what the curve needs and what identifies the run:

    {"head": path, "created": time, "steps": int, "train_s": float,
     "data": {"sequences", "tokens", "sha256" (the frozen dataset's)},
     "heldout": {"data_hash", "curve": [{"step", "train_s", "acc": [acc per TTT step]}]}}

`chained_curve` lays the runs end to end on cumulative training minutes (run r's point at t seconds
is plotted at sum(train_s of runs < r) + t), keeping only runs evaluated on the head's own held-out
set (same `data_hash`): accuracies on different held-out sets are not one curve.

    draftgym head-report --head data/heads/smollm2-135m   # table + data/reports/head-report/smollm2-135m.png
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import DraftGymError

CURVE_PNG = "heldout_curve.png"             # written next to a head by train-draft
REPORT_DIR = "data/reports/head-report"     # where head-report writes its plot


def _read_manifest(head_dir: str | Path) -> dict | None:
    p = Path(head_dir) / "manifest.json"
    if not p.is_file():
        return None
    try:
        m = json.loads(p.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DraftGymError(f"{p}: not a readable manifest ({e})") from None
    if not isinstance(m, dict):
        raise DraftGymError(f"{p}: not a head manifest (a JSON {type(m).__name__}, not an object)")
    return m


def lineage_entry(manifest: dict, head: str) -> dict:
    """One run of the lineage, from its head's manifest."""
    tr, data, ho = manifest.get("training", {}), manifest.get("data", {}), manifest.get("heldout") or {}
    return {"head": str(head), "created": manifest.get("created"), "steps": tr.get("steps"),
            "train_s": tr.get("train_s", 0.0),
            "data": {"sequences": data.get("sequences"), "tokens": data.get("tokens"),
                     "sha256": (data.get("frozen") or {}).get("sha256")},
            "heldout": {"data_hash": ho.get("data_hash"),
                        "curve": [{"step": p["step"], "train_s": p["train_s"], "acc": p["acc"]}
                                  for p in ho.get("curve", [])]}}


def lineage_of(init_dir: str | Path, name: str | None = None) -> list[dict]:
    """The lineage a head warm-started from `init_dir` inherits: init_dir's own lineage + init_dir.
    A parent without a manifest (e.g. an official head) has no recorded history: []."""
    m = _read_manifest(init_dir)
    if m is None:
        return []
    return list(m.get("lineage", [])) + [lineage_entry(m, name or str(init_dir))]


def runs_of(manifest: dict, head: str) -> list[dict]:
    """Every run behind a head, oldest first: its lineage, then the head's own run."""
    return list(manifest.get("lineage", [])) + [lineage_entry(manifest, head)]


def chained_curve(manifest: dict, head: str = "this head") -> list[dict]:
    """Held-out points of every run with the head's held-out set, on cumulative training time.
    Returns [{"run", "head", "minutes", "step" (within its run), "acc"}], oldest first; a run's step-0
    point repeats its parent's last one and is dropped after the first run."""
    runs = runs_of(manifest, head)
    own = runs[-1]["heldout"]["data_hash"]
    out, offset_s = [], 0.0
    for r, run in enumerate(runs):
        if run["heldout"]["data_hash"] == own and own is not None:
            for p in run["heldout"]["curve"]:
                if p["step"] == 0 and out:
                    continue
                out.append({"run": r, "head": run["head"], "minutes": (offset_s + p["train_s"]) / 60,
                            "step": p["step"], "acc": p["acc"]})
        offset_s += float(run["train_s"] or 0.0)
    return out


def plot_lineage(manifest: dict, out_png: str | Path, head: str = "this head", steps: int = 4) -> Path:
    """Held-out accuracy of TTT steps 0..steps-1 against cumulative training minutes; dotted lines
    mark where a new run (new data) warm-started from the last head."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = chained_curve(manifest, head)
    if not pts:
        raise DraftGymError(f"{head}: the manifest has no held-out curve (trained without --heldout-prompts?)")
    fig, ax = plt.subplots(figsize=(7, 4))
    x = [p["minutes"] for p in pts]
    for k in range(min(steps, len(pts[0]["acc"]))):
        ax.plot(x, [p["acc"][k] for p in pts], marker="o", ms=3, label=f"TTT step {k}" + (" (first draft token)" if k == 0 else ""))
    for a, b in zip(pts, pts[1:]):
        if b["run"] != a["run"]:
            ax.axvline(a["minutes"], color="grey", ls=":", lw=1)
    ax.set_xlabel("cumulative training minutes (all runs of the lineage)")
    ax.set_ylabel("held-out top-1 accuracy vs the target")
    ax.set_title(f"{Path(head).name}: held-out accuracy ({manifest.get('heldout', {}).get('sequences')} sequences)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out_png = Path(out_png)
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return out_png


@dataclass
class HeadReportConfig:
    """`draftgym head-report`: a trained head's held-out accuracy over all runs of its lineage."""

    head: str = "default"           # 'default' (the shipped head) or a head directory
    out: str | None = None          # the PNG; None: data/reports/head-report/<head directory name>.png
                                    # (a report never writes into the head's own directory)


def report_png(cfg: HeadReportConfig, head_dir: Path) -> Path:
    """Where the plot goes: --out, else data/reports/head-report/<head directory name>.png."""
    return Path(cfg.out) if cfg.out else Path(REPORT_DIR) / f"{head_dir.name}.png"


def lineage_table(runs: list[dict]) -> list[str]:
    """One line per run (header first); the head column is as wide as its longest name, never cut."""
    head_w = max([len("head")] + [len(str(run["head"])) for run in runs])
    lines = [f"{'run':>3}  {'head':{head_w}s} {'steps':>6} {'train min':>9} {'sequences':>9}  held-out step-0 acc"]
    for r, run in enumerate(runs):
        c = run["heldout"]["curve"]
        acc = f"{c[0]['acc'][0]:.3f} -> {c[-1]['acc'][0]:.3f}" if c else "-"
        lines.append(f"{r:>3}  {str(run['head']):{head_w}s} {run['steps'] or 0:>6} "
                     f"{float(run['train_s'] or 0) / 60:>9.1f} {run['data']['sequences'] or 0:>9}  {acc}")
    return lines


def run_head_report_command(cfg: HeadReportConfig) -> int:
    """Print the lineage table and write the held-out curve plot (to `report_png`, outside the head)."""
    from pipeline.models.head import resolve_head_dir

    d = resolve_head_dir(cfg.head)
    m = _read_manifest(d)
    if m is None:
        raise DraftGymError(f"{d}: no manifest.json (a head trained by draftgym train-draft has one)")
    out = report_png(cfg, Path(d))
    try:
        table = lineage_table(runs_of(m, str(cfg.head)))
        out.parent.mkdir(parents=True, exist_ok=True)
        png = plot_lineage(m, out, str(cfg.head))
    except (KeyError, IndexError, TypeError, AttributeError) as e:
        raise DraftGymError(f"{d / 'manifest.json'}: not a head manifest ({type(e).__name__}: {e})") from None
    print("\n".join(table))
    print(f"plot: {png}")
    return 0
