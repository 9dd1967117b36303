"""EAGLE-3 head training (pipeline.train_head: loop, run, checkpoint, ttt) on a tiny random Llama target, no tokenizer needed.

The key test is `test_trained_head_drafts_in_the_engine`: a head trained on the target's own greedy
continuations must reach tau > 1 in `Engine.generate` on those sequences (and stay lossless). If the
training-time-test positions disagreed with the engine's, tau would stay ~1.
"""
from __future__ import annotations

import copy
import json

import pytest
import torch

from pipeline.decode.controller import StaticController
from pipeline.decode.engine.single import Engine
from pipeline.models.head import load_head, random_head
from pipeline.train_head.batches import pad_batch
from pipeline.train_head.config import TrainConfig
from pipeline.train_head.data import TrainSequence
from pipeline.train_head.features import FeatureStore, batch_features
from pipeline.train_head.initialise import build_draft_vocab, build_head
from pipeline.train_head.loop import train_head
from pipeline.train_head.ttt import ttt_loss
from pipeline.decode.verify import target_forward
from tests.conftest import make_tiny_llama

VOCAB = 128


def _sharp_tiny_llama(seed: int = 0):
    """A tiny random Llama whose next-token distributions are peaked, like a trained LM's."""
    model = make_tiny_llama(vocab=VOCAB, hidden=32, layers=4, heads=4, kv_heads=2, seed=seed)
    with torch.no_grad():
        model.lm_head.weight.mul_(60.0)
    return model


def _cfg(**kw) -> TrainConfig:
    base = dict(model="tiny-llama", draft_vocab_size=64, ttt_steps=4, steps=100, batch_size=8, batch_tokens=4096,
                lr=3e-3, warmup_steps=5, amp="none", log_every=10, checkpoint_every=0, checkpoint_every_min=1e9,
                val_fraction=0.0, out="unused")
    base.update(kw)
    return TrainConfig(**base)


@pytest.fixture(scope="module")
def distilled():
    """The tiny target and its own greedy continuations of 16 random prompts (self-distillation)."""
    model = _sharp_tiny_llama()
    eng = Engine(model, None)
    gen = torch.Generator().manual_seed(1)
    seqs = []
    for _ in range(16):
        prompt = torch.randint(0, VOCAB, (8,), generator=gen).tolist()
        seqs.append(TrainSequence(prompt + eng.generate_ar(prompt, max_new_tokens=40).output_ids, len(prompt)))
    return model, seqs


@pytest.fixture(scope="module")
def trained(distilled, tmp_path_factory):
    model, seqs = distilled
    root = tmp_path_factory.mktemp("train_draft")
    cfg = _cfg(out=str(root / "head"))
    manifest = train_head(cfg, model, seqs, root / "head", root / "work", data_info={"datasets": {"tiny": 16}},
                          progress_bar=False)
    return model, seqs, manifest, root / "head", cfg


# ----------------------------------------------------------------------------- the training loop

def test_loss_falls(trained):
    _, _, manifest, _, _ = trained
    curve = manifest["curve"]
    assert curve[0]["step"] == 1 and curve[-1]["step"] == 100
    assert curve[-1]["loss"] < 0.7 * curve[0]["loss"], (curve[0]["loss"], curve[-1]["loss"])
    assert curve[-1]["acc"][0] > 0.5 and curve[-1]["acc"][0] > curve[0]["acc"][0] + 0.3


def test_trained_head_drafts_in_the_engine(trained):
    """Train/inference conventions agree: tau > 1 on the training sequences, outputs lossless."""
    model, seqs, manifest, _, _ = trained
    head = manifest["_head"]
    eng = Engine(model, head)
    taus, random_taus = [], []
    rand = Engine(model, random_head(model, draft_vocab_size=64, seed=5))
    for s in seqs[:6]:
        prompt = s.ids[: s.prompt_len]
        ar = eng.generate_ar(prompt, max_new_tokens=40)
        assert ar.output_ids == s.ids[s.prompt_len:]
        sp = eng.generate(prompt, max_new_tokens=40, controller=StaticController(8, 10, 60))
        assert sp.output_ids == ar.output_ids
        taus.append(sp.tau)
        random_taus.append(rand.generate(prompt, max_new_tokens=40, controller=StaticController(8, 10, 60)).tau)
        chain = eng.generate(prompt, max_new_tokens=40, controller=StaticController(4, 1, 5))   # one chain, W = 1
        assert chain.output_ids == ar.output_ids
    mean_tau = sum(taus) / len(taus)
    assert mean_tau > 2.0, taus
    assert mean_tau > sum(random_taus) / len(random_taus) + 0.8, (taus, random_taus)


def test_ttt_matches_sequential_drafting(distilled):
    """Step i of the training-time test at index t gives the same logits as the engine's way of
    drafting: prefix entries (f_s, x_{s+1}) for s <= t, then a chain fed (g_parent, x) at t+1, t+2 ..."""
    model, seqs = distilled
    cfg = _cfg()
    vocab_ids, _ = build_draft_vocab(seqs, 64, VOCAB)
    head = build_head(model, vocab_ids, cfg).eval()
    torch.nn.init.normal_(head.midlayer.self_attn.o_proj.weight, std=0.3)   # make attention matter
    idx = [0, 3, 5]
    dev = torch.device("cpu")
    ids, lens, pl, T = pad_batch(seqs, idx, dev)
    fused, final, am = batch_features(model, head.layer_ids, seqs, idx, T, dev, False, None)
    lm_w = model.get_output_embeddings().weight[vocab_ids].float()
    t2draft = torch.full((VOCAB,), -1, dtype=torch.long)
    t2draft[vocab_ids] = torch.arange(64)
    K = 4
    cap: list = []
    with torch.no_grad():
        ttt_loss(head, ids, lens, pl, fused, final, am, lm_w, t2draft, K, 0.8, False, capture=cap)
        b, seq = 1, seqs[3].ids
        # the engine's features: head.fuse over target_forward hidden states (fp32; the trainer's pass through fp16)
        _, hs = target_forward(model, torch.tensor([seq]), torch.arange(len(seq))[None], _cache(model))
        f_engine = head.fuse(hs)
        f_train = head.fc(fused[b: b + 1, : len(seq)])
        assert torch.allclose(f_train, f_engine, atol=2e-2)                # same layers, fp16 rounding only
        for t in (7, 12, 20):
            x = torch.tensor([seq])
            g, lg, kv = head(x[:, 1: t + 2], f_train[:, : t + 1], torch.arange(t + 1))   # prefix entries 0..t
            hid, chain_logits = g[:, -1:], [lg[0, -1]]
            past = kv
            for i in range(1, K):
                g, lg, nkv = head(x[:, t + 1 + i: t + 2 + i], hid, torch.tensor([t + i]), past_kv=past)
                past = (torch.cat([past[0], nkv[0]], 2), torch.cat([past[1], nkv[1]], 2))
                hid = g
                chain_logits.append(lg[0, -1])
            for i, (pos, logits) in enumerate(cap):
                r = int((pos == t).nonzero())
                assert torch.allclose(logits[b, r], chain_logits[i], atol=1e-4), (t, i)


def _cache(model):
    from transformers import DynamicCache
    return DynamicCache(config=model.config)


def test_saved_head_reloads_with_identical_logits(trained):
    model, seqs, manifest, out, _ = trained
    cfg_json = json.loads((out / "config.json").read_text())
    assert cfg_json["torch_dtype"] == "bfloat16" and cfg_json["draft_vocab_size"] == 64
    from safetensors.torch import load_file
    sd = load_file(str(out / "model.safetensors"))
    assert sd["fc.weight"].dtype == torch.bfloat16 and "embed_tokens.weight" not in sd
    loaded = load_head(str(out), model)
    assert next(loaded.parameters()).dtype == torch.float32          # bf16 file -> the target's fp32
    ref = copy.deepcopy(manifest["_head"])
    with torch.no_grad():
        for p in ref.parameters():
            if p.requires_grad:
                p.copy_(p.bfloat16().float())
    assert torch.equal(loaded.d2t, ref.d2t) and torch.equal(loaded.t2d, ref.t2d)
    ids = torch.tensor([seqs[0].ids[:20]])
    hidden = torch.randn(1, 20, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        g1, l1, _ = loaded(ids, hidden, torch.arange(20))
        g2, l2, _ = ref(ids, hidden, torch.arange(20))
    assert torch.allclose(l1, l2, atol=1e-5) and torch.allclose(g1, g2, atol=1e-5)
    man = json.loads((out / "manifest.json").read_text())
    assert man["training"]["steps"] == 100 and man["sizes"]["draft_vocab_size"] == 64
    assert man["data"]["datasets"] == {"tiny": 16} and man["environment"]["torch"] == torch.__version__
    assert len(man["final_metrics"]["train_acc"]) == 4 and man["seed"] == 0


def test_resume_continues_identically(distilled, tmp_path):
    """Stop after 10 of 20 steps, resume: same parameters as one uninterrupted run."""
    model, seqs = distilled
    full = train_head(_cfg(steps=20), model, seqs, tmp_path / "a", tmp_path / "wa", progress_bar=False)["_head"]
    stopped = train_head(_cfg(steps=20), model, seqs, tmp_path / "b", tmp_path / "wb", progress_bar=False,
                         callback=lambda step: step >= 10)
    assert stopped["training"]["steps"] == 10 and stopped["training"]["stop_reason"] == "callback"
    assert (tmp_path / "wb" / "checkpoint.pt").is_file()
    resumed = train_head(_cfg(steps=20, resume=True), model, seqs, tmp_path / "b", tmp_path / "wb",
                         progress_bar=False)
    assert resumed["training"]["steps"] == 20
    for (n, p), (_, q) in zip(full.named_parameters(), resumed["_head"].named_parameters()):
        assert torch.equal(p, q), n


def test_feature_cache_matches_fresh_features(distilled, tmp_path):
    model, seqs = distilled
    head = random_head(model, seed=0)
    lengths = [len(s.ids) for s in seqs]
    store = FeatureStore(tmp_path / "f", lengths, 3 * 32, 32)
    idx = [2, 7]
    T = max(lengths[i] for i in idx)
    first = batch_features(model, head.layer_ids, seqs, idx, T, torch.device("cpu"), False, store)
    assert store.done[2] and store.done[7] and not store.done[0]
    store.flush()
    again = FeatureStore(tmp_path / "f", lengths, 3 * 32, 32)                 # reopened: reads the cache
    assert again.done[2]
    second = batch_features(model, head.layer_ids, seqs, idx, T, torch.device("cpu"), False, again)
    for a, b in zip(first, second):
        assert torch.equal(a, b)


# ----------------------------------------------------------------------------- data plumbing

def test_init_cross_entropy_at_or_below_uniform(distilled, tmp_path):
    """A fresh head's TTT loss at initialisation is at or below that of the uniform guess (cross-entropy
    ln(draft vocab) at every step) for the target-based inits (the logit scale is calibrated on the
    first batch), each step's cross-entropy is near ln(draft vocab) or below, and the calibration is
    recorded."""
    import math

    model, seqs = distilled
    uniform = sum(0.8 ** i * math.log(64) for i in range(4))
    for init in ("passthrough", "target"):
        man = train_head(_cfg(steps=1, init=init, out=str(tmp_path / init)), model, seqs, tmp_path / init,
                         tmp_path / f"w-{init}", progress_bar=False)
        ce, at = man["init"]["ce_per_step"], man["init"]["loss_at_scale"]
        assert man["init"]["init"] == init and man["init"]["logit_scale"] in (1.0, 0.7, 0.5, 0.35, 0.25, 0.18, 0.12,
                                                                              0.08, 0.05, 0.0)
        assert abs(at["0.0"] - uniform) < 1e-3                          # scale 0: the uniform guess, exactly
        assert at[str(man["init"]["logit_scale"])] <= uniform + 1e-4
        assert all(c <= 1.05 * math.log(64) for c in ce), (init, ce)
        # the unscaled init is what the calibration improves on: never better than the chosen scale
        assert man["init"]["loss_at_scale"]["1.0"] >= man["init"]["loss_at_scale"][str(man["init"]["logit_scale"])]


def test_passthrough_init_starts_as_the_logit_lens(distilled):
    """passthrough: fc passes the highest fused layer through and the attention/MLP outputs are zero,
    so the head's output g equals that target layer's hidden state."""
    model, seqs = distilled
    ids = torch.tensor([seqs[0].ids])
    head = build_head(model, torch.arange(64), _cfg(init="passthrough"))
    from pipeline.decode.verify import target_forward as tf
    from transformers import DynamicCache
    _, hs = tf(model, ids, torch.arange(ids.shape[1])[None], DynamicCache(config=model.config))
    with torch.no_grad():
        g, _, _ = head(ids, head.fuse(hs), torch.arange(ids.shape[1]))
    assert torch.allclose(g, hs[head.layer_ids[2]], atol=1e-6)


def test_resume_refuses_changed_data_and_missing_or_ignored_checkpoints(distilled, tmp_path):
    from pipeline.errors import DraftGymError

    model, seqs = distilled
    train_head(_cfg(steps=4), model, seqs, tmp_path / "h", tmp_path / "w", progress_bar=False)
    with pytest.raises(DraftGymError, match="holds a run of this --out: pass --resume to continue it or --restart"):
        train_head(_cfg(steps=4), model, seqs, tmp_path / "h", tmp_path / "w", progress_bar=False)
    with pytest.raises(DraftGymError, match="trained on other data .16 sequences.*now 15"):
        train_head(_cfg(steps=8, resume=True), model, seqs[:15], tmp_path / "h", tmp_path / "w", progress_bar=False)
    with pytest.raises(DraftGymError, match=r"other settings \(ttt_steps 4 -> 3\)"):
        train_head(_cfg(steps=8, resume=True, ttt_steps=3), model, seqs, tmp_path / "h", tmp_path / "w",
                   progress_bar=False)
    with pytest.raises(DraftGymError, match="--resume: no checkpoint in"):
        train_head(_cfg(steps=4, resume=True), model, seqs, tmp_path / "h2", tmp_path / "w2", progress_bar=False)
    again = train_head(_cfg(steps=2, restart=True), model, seqs, tmp_path / "h", tmp_path / "w", progress_bar=False)
    assert again["training"]["steps"] == 2


def test_session_budget_stops_without_changing_the_schedule(distilled, tmp_path):
    """--session-budget-min ends this session (checkpoint + head); the schedule still runs over the
    total budget, and the sessions are listed in the manifest."""
    model, seqs = distilled
    man = train_head(_cfg(steps=None, time_budget_min=60, session_budget_min=1e-6), model, seqs, tmp_path / "h",
                     tmp_path / "w", progress_bar=False)
    t = man["training"]
    assert t["stop_reason"] == "session" and t["steps"] <= 1 and len(t["sessions"]) == 1
    assert t["sessions"][0]["stop_reason"] == "session" and "cpu_model" in t["sessions"][0]
    man2 = train_head(_cfg(steps=None, time_budget_min=60, session_budget_min=1e-6, resume=True), model, seqs,
                      tmp_path / "h", tmp_path / "w", progress_bar=False)
    assert len(man2["training"]["sessions"]) == 2


def test_curriculum_run_logs_its_steps(distilled, tmp_path):
    model, seqs = distilled
    man = train_head(_cfg(steps=20, ttt_curriculum=("2@0", "4@0.5"), log_every=5), model, seqs, tmp_path / "h",
                     tmp_path / "w", progress_bar=False)
    ks = {p["step"]: p["ttt_steps"] for p in man["curve"] if "ttt_steps" in p}
    assert ks[5] == 2 and ks[20] == 4


def test_init_from_a_saved_head_keeps_its_weights_and_vocabulary(distilled, tmp_path):
    """--init-from: a run whose checkpoint is gone goes on from the committed head (bf16 weights)."""
    model, seqs = distilled
    train_head(_cfg(steps=6), model, seqs, tmp_path / "h1", tmp_path / "w1", progress_bar=False)
    saved = load_head(str(tmp_path / "h1"), model, dtype=torch.float32)
    man = train_head(_cfg(steps=1, lr=1e-12, warmup_steps=0, init_from=str(tmp_path / "h1")), model, seqs[:12],
                     tmp_path / "h2", tmp_path / "w2", progress_bar=False)
    assert man["init"] == {"init": "from", "from": str(tmp_path / "h1")}
    head = man["_head"]
    assert torch.equal(head.d2t, saved.d2t)
    for name in ("fc.weight", "lm_head.weight", "midlayer.mlp.down_proj.weight"):
        a, b = head.state_dict()[name], saved.state_dict()[name]
        assert torch.allclose(a, b, atol=1e-6), name


def test_heldout_curve_is_recorded_and_continues_on_resume(distilled, tmp_path):
    """The fixed held-out set is evaluated at step 0, every eval_every steps and at the end; a resumed
    run extends the same curve."""
    model, seqs = distilled
    kw = dict(steps=12, eval_every=5)
    man = train_head(_cfg(**kw), model, seqs[:12], tmp_path / "h", tmp_path / "w", progress_bar=False,
                     heldout=seqs[12:], callback=lambda step: step >= 7)
    assert [p["step"] for p in man["heldout"]["curve"]] == [0, 5, 7] and man["heldout"]["sequences"] == 4
    man = train_head(_cfg(resume=True, **kw), model, seqs[:12], tmp_path / "h", tmp_path / "w", progress_bar=False,
                     heldout=seqs[12:])
    curve = man["heldout"]["curve"]
    assert [p["step"] for p in curve] == [0, 5, 7, 10, 12] and len(curve[0]["acc"]) == 4
    assert curve[-1]["loss"] < curve[0]["loss"]


def test_lineage_chains_the_heldout_curves_of_warm_started_runs(distilled, tmp_path, capsys):
    """Three runs, each warm-started from the last head (--init-from): the third head's manifest
    carries both earlier runs' held-out curves, chained on cumulative training time, and the
    head-report command prints the lineage and writes the plot (also written next to each head)."""
    from pipeline.train_head.lineage import CURVE_PNG, HeadReportConfig, chained_curve, run_head_report_command

    model, seqs = distilled
    kw = dict(steps=4, eval_every=2)
    parent = None
    for name in ("a", "b", "c"):
        man = train_head(_cfg(init_from=parent, **kw), model, seqs[:12], tmp_path / name, tmp_path / f"w{name}",
                         progress_bar=False, heldout=seqs[12:])
        parent = str(tmp_path / name)
    assert [e["head"] for e in man["lineage"]] == [str(tmp_path / "a"), str(tmp_path / "b")]
    assert "lineage" not in man["init"] and man["init"]["from"] == str(tmp_path / "b")
    assert man["lineage"][0]["heldout"]["curve"][-1]["step"] == 4
    saved = json.loads((tmp_path / "c" / "manifest.json").read_text())
    assert saved["lineage"] == man["lineage"]
    pts = chained_curve(saved)
    # run a: steps 0, 2, 4; runs b, c: 2, 4 (their step 0 repeats the parent's end)
    assert [(p["run"], p["step"]) for p in pts] == [(0, 0), (0, 2), (0, 4), (1, 2), (1, 4), (2, 2), (2, 4)]
    minutes = [p["minutes"] for p in pts]
    assert minutes == sorted(minutes) and minutes[-1] > minutes[2]
    b = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert saved["lineage"][1]["heldout"]["curve"] == [{k: p[k] for k in ("step", "train_s", "acc")}
                                                        for p in b["heldout"]["curve"]]
    assert saved["lineage"][1]["train_s"] == b["training"]["train_s"] > 0
    assert (tmp_path / "c" / CURVE_PNG).stat().st_size > 1000
    out = tmp_path / "curve.png"
    assert run_head_report_command(HeadReportConfig(head=str(tmp_path / "c"), out=str(out))) == 0
    printed = capsys.readouterr().out
    rows = [ln for ln in printed.splitlines() if ln.strip()[:1].isdigit()]
    assert out.is_file() and [ln.split()[0] for ln in rows] == ["0", "1", "2"]
    # a manifest that is not a head's gives one line naming the file, and leaves the file as it was
    from pipeline.errors import DraftGymError
    for bad in ('{"heldout": {"curve": [{"step": 0}]}}', "[1, 2]", '{"lineage": '):
        (tmp_path / "c" / "manifest.json").write_text(bad)
        with pytest.raises(DraftGymError, match="manifest"):
            run_head_report_command(HeadReportConfig(head=str(tmp_path / "c"), out=str(out)))
        assert (tmp_path / "c" / "manifest.json").read_text() == bad
