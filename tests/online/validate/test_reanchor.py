"""validate's re-anchored sim-vs-real (online/validate/reanchor.py): each method replayed on its own decoded text.

1. A decoded text that leaves the logged one (as bf16 does at a near-tie), constructed in fp32: the
   logs hold, per prompt, the greedy text with one token changed at k = 3 and greedy after it. Replayed
   on the logs, static shapes miss the measured tau; replayed on their own texts they reproduce the
   measured cycles' accepted lengths, so the re-anchored tau error is exactly 0.
2. fp32 end to end (`draftgym validate` on a tiny target): the decoded text is the logged text, so the
   re-anchored replay equals the logs' replay; --no-reanchor turns it off.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from online.cli import main as cli
from tests.conftest import build_tiny_logs, make_tiny_llama

VOCAB, HIDDEN, SEED, DMAX, T, K = 16, 32, 1, 8, 24, 3   # W = 10 needs a vocabulary of >= 10 tokens
GRID = (1, 2, 4, 8, 10, 20, 30, 60)


@pytest.fixture(scope="module")
def diverged(tmp_path_factory):
    """(engine, head, recs, runs, SimSide over logs of other texts, a Batch1Config)."""
    from online.validate.reanchor import collect_texts
    from pipeline.collect.actor import write_prompt_log
    from pipeline.logs.storage import resolve_out
    from online.validate.speedbench import run_methods
    from online.validate.common import Batch1Config
    from online.validate.batch1 import SimSide
    from pipeline.collect.prompt import CollectConfig
    from pipeline.datasets import PromptRecord
    from pipeline.decode.controller import StaticController
    from pipeline.decode.step_shape import EAGLE3_DEFAULT_SHAPE
    from pipeline.decode.engine.core import BatchEngine
    from pipeline.decode.engine.single import Engine
    from pipeline.models.head import random_head
    from simulator.latency.model import LatencyModel
    from simulator.logs.replay_logs import load_logs

    tmp = tmp_path_factory.mktemp("reanchor")
    model = make_tiny_llama(vocab=VOCAB, hidden=HIDDEN, seed=SEED)
    head = random_head(model, seed=0)
    core = BatchEngine(model, head)
    eng = Engine.on(core)                  # re-anchoring's batch-1 calls on the engine the methods decode on
    prompts = [torch.randint(0, VOCAB, (6,), generator=torch.Generator().manual_seed(s)).tolist() for s in range(3)]
    recs = [PromptRecord(f"tiny/p{s}", "tiny", ({"role": "user", "content": f"p{s}"},), None) for s in range(3)]
    methods = {"ar": None, "static": StaticController(*EAGLE3_DEFAULT_SHAPE), "grid-best": StaticController(4, 10, 10)}
    runs, verdicts = run_methods(core, prompts, methods, T, runs=1, progress=False)
    assert all(v.status == "exact" for *_, v in verdicts)          # fp32: every method decodes AR's text
    # the "logged" texts: AR's with token K changed, then greedy from there (what a bf16 collection
    # that broke a near-tie the other way would hold)
    texts = []
    for p, res in zip(prompts, runs["ar"].results[0]):
        y = res.output_ids[:K] + [(res.output_ids[K] + 1) % VOCAB]
        y += eng.generate_ar(p + y, T - len(y)).output_ids
        assert len(y) == T and y != res.output_ids
        texts.append((y, "max_new_tokens"))
    ccfg = CollectConfig(model="tiny", head="random", dtype="float32", dataset="tiny", split="test", max_new_tokens=T,
                         widths=(10,), max_depth=DMAX, verify_grid=GRID)
    logs, secs = collect_texts(eng, head, prompts, texts, ccfg)
    store = resolve_out(tmp / "logs")
    for r, p, log, s in zip(recs, prompts, logs, secs):
        assert len(log.output_tokens) == T + DMAX                # the lookahead
        write_prompt_log(store, ccfg, head.head_id, "{}", r.prompt_id, ccfg.dataset, r.split, p, log, s)
    lat = LatencyModel.from_constants(draft_step=0.002, verify=0.01, verify_per_token=1e-4)
    sim = SimSide(logs=load_logs(tmp / "logs"), lat=lat, clock=lat, grid={"all": (4, 10, 10)})
    cfg = Batch1Config(model="tiny", head="random", logs=str(tmp / "logs"), out=str(tmp / "out"), max_new_tokens=T)
    return eng, head, recs, runs, sim, cfg


def test_reanchored_replay_reproduces_the_measured_cycles(diverged):
    from online.validate.reanchor import Reanchored, reanchor_for_validate
    from online.validate.sim_vs_real import sim_vs_real
    from simulator import baselines
    from simulator.replay import simulate

    eng, head, recs, runs, sim, cfg = diverged
    own = reanchor_for_validate(cfg, sim, eng, head, recs, runs, "float32", "run0")
    assert isinstance(own, Reanchored)
    assert own.info["texts"] == 3                               # static and grid-best decoded the same texts
    assert own.seq_ids["static"] == own.seq_ids["grid-best"] and set(own.seq_ids) == {"static", "grid-best"}
    assert own.info["runs_disagree"] == {"static": 0, "grid-best": 0}
    # the replay on its own text walks the measured cycles: the same accepted lengths, cycle by cycle
    for name, shape in (("static", (8, 10, 60)), ("grid-best", (4, 10, 10))):
        ev = own.logs.subset(np.isin(own.logs.prompt_id, [own.seq_ids[name][i] for i in range(3)]))
        res = simulate(baselines.StaticPolicy(*shape), ev, sim.clock, trace=True)
        for s, pid in enumerate(ev.prompt_id):
            i = next(i for i, x in own.seq_ids[name].items() if x == pid)
            got = res.trace["accepted"][res.trace["seq"] == s].tolist()
            assert got == [c.accepted for c in runs[name].results[0][i].cycles], (name, pid)
    out = sim_vs_real(cfg, sim, recs, runs, [], own)
    assert out["reanchored"]["texts"] == 3 and not out["missing_prompts"]
    for name in ("static", "grid-best"):
        m = out["methods"][name]
        r = m["reanchored"]
        assert r["sim_tau"] == pytest.approx(m["real_tau"], rel=1e-12) and r["tau_rel_error"] == pytest.approx(0, abs=1e-12)
        assert abs(m["tau_rel_error"]) > 0.02                   # the logs' text is another text: its tau is off
        assert r["sim_decode_tokens_per_s"] > 0 and r["tokens_per_s_rel_error"] is not None
    # the Markdown report shows both errors
    from online.validate.report import write_markdown

    rep = {"run_id": "run0", "config": {"model": "tiny", "temperature": 0.0, "runs": 1, "n_prompts": 3, "split": "test",
                                        "max_new_tokens": T}, "device": "cpu", "head_id": head.head_id,
           "environment": {"torch": "-", "transformers": "-"}, "wall_s": 1.0,
           "datasets": {"tiny": {"lossless": True, "lossless_checked": True, "lossless_counts": None,
                                 "methods": {}, "sim_vs_real": out}}}
    write_markdown(rep, Path(cfg.out))
    md = (Path(cfg.out) / "report.md").read_text()
    assert "tau error (logs / re-anchored)" in md
    s = out["methods"]["static"]
    assert f"{100 * s['tau_rel_error']:+.1f}% / +0.0%" in md


def test_reanchor_only_when_wanted(diverged):
    """Off with cfg.reanchor = False and at T > 0 (the logs are then sampled continuations coupled to the
    replay, not a text to re-anchor on)."""
    from dataclasses import replace

    from online.validate.reanchor import reanchor_for_validate

    eng, head, recs, runs, sim, cfg = diverged
    assert reanchor_for_validate(replace(cfg, reanchor=False), sim, eng, head, recs, runs, "float32", "r") is None
    assert reanchor_for_validate(replace(cfg, temperature=1.0), sim, eng, head, recs, runs, "float32", "r") is None


@pytest.fixture(scope="module")
def tiny_logs(tmp_path_factory, tiny_model_dir):
    return build_tiny_logs(tmp_path_factory.mktemp("logs"), tiny_model_dir, n_prompts=2)


def test_validate_fp32_reanchored_equals_the_logs(tmp_path, tiny_model_dir, tiny_logs, capsys):
    base = ["validate", "--model", str(tiny_model_dir), "--head", "random", "--policy", "ddd", "--dataset", "mt-bench",
            "--runs", "1", "--max-new-tokens", "16", "--logs", str(tiny_logs), "--json"]
    out = tmp_path / "report"
    capsys.readouterr()
    assert cli(base + ["--n-prompts", "2", "--out", str(out)]) == 0
    rep = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    svr = rep["datasets"]["mt-bench"]["sim_vs_real"]
    assert svr["reanchored"]["texts"] == 2                      # fp32: every method decoded AR's text, once per prompt
    assert set(svr["methods"]) == {"static", "grid-best", "ddd"}
    for m in svr["methods"].values():                           # the decoded text is the logged text
        r = m["reanchored"]
        assert r["sim_tau"] == pytest.approx(m["sim_tau"], rel=1e-12)
        assert r["tau_rel_error"] == pytest.approx(m["tau_rel_error"], rel=1e-9, abs=1e-12)
        assert r["sim_decode_tokens_per_s"] == pytest.approx(m["sim_decode_tokens_per_s"], rel=1e-9)
        assert r["tokens_per_s_rel_error"] == pytest.approx(m["tokens_per_s_rel_error"], rel=1e-9, abs=1e-12)
    root = out / "reanchored" / rep["run_id"]
    assert svr["reanchored"]["root"] == str(root) and list((root / "sequences").rglob("*.parquet"))
    assert "tau error (logs / re-anchored)" in (out / "report.md").read_text()
    off = tmp_path / "off"
    assert cli(base + ["--n-prompts", "1", "--no-reanchor", "--out", str(off)]) == 0
    svr = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["datasets"]["mt-bench"]["sim_vs_real"]
    assert "reanchored" not in svr and all("reanchored" not in m for m in svr["methods"].values())
    assert not (off / "reanchored").exists() and "re-anchored" not in (off / "report.md").read_text()
