"""--dtype end to end: logs and latency profiles carry their dtype and never mix; every command that
loads a target takes --dtype; bf16 replay agrees with bf16 decoding up to the first divergence."""
from __future__ import annotations

import pytest
import torch

from pipeline.errors import DataError
from simulator.latency.model import LatencyModel
from simulator.logs.synthetic import SyntheticConfig, latency_rows, write_latency, write_synthetic_logs


def _rows(profile_id: str, dtype: str, scale: float = 1.0, model: str = "m") -> list[dict]:
    rows = latency_rows(model, "cpu", widths=(10,), profile_id=profile_id)
    for r in rows:
        r["dtype"] = dtype
        for k in ("median", "p10", "p90", "mean"):
            r[k] *= scale
    return rows


def test_latency_model_picks_the_logs_dtype_and_refuses_mixing():
    fp32, bf16 = _rows("20260101-000000-a", "float32"), _rows("20260102-000000-b", "bfloat16", scale=0.5)
    both = fp32 + bf16
    # the newest profile is the bf16 one, but fp32 logs get the fp32 profile
    assert LatencyModel.from_rows(both, dtype="float32").meta["profile_id"] == "20260101-000000-a"
    assert LatencyModel.from_rows(both, dtype="bfloat16").meta["dtype"] == "bfloat16"
    with pytest.raises(DataError, match="no float16 latency profile .*profiles exist in: bfloat16, float32"):
        LatencyModel.from_rows(both, dtype="float16")
    mixed = _rows("20260103-000000-c", "float32") + _rows("20260103-000000-c", "bfloat16")[:3]
    with pytest.raises(DataError, match="mixes dtypes"):
        LatencyModel.from_rows(mixed)
    with pytest.raises(DataError, match="mixes dtypes"):
        LatencyModel.from_rows(mixed, dtype="float32", profile="20260103-000000-c")


def test_logs_carry_their_dtype(tmp_path):
    from simulator.evaluate import evaluate
    from simulator.logs.replay_logs import load_logs

    write_synthetic_logs(tmp_path, SyntheticConfig(n_sequences=3, widths=(10,)))
    logs = load_logs(tmp_path)
    assert logs.dtype == "float32"
    with pytest.raises(DataError, match="no bfloat16 logs .*have float32"):
        load_logs(tmp_path, dtype="bfloat16")
    # a bf16 profile beside fp32 logs is never used for them, even when it is the newest
    write_latency(tmp_path, _rows("29990101-000000-z", "bfloat16", model=logs.model))
    rep = evaluate(tmp_path, split="all", policies=["static:1,10,4"], tune_split="all")
    assert rep["latency"]["profile_id"] != "29990101-000000-z"
    # unless asked for explicitly (a transfer experiment: these logs, the bf16 clock)
    rep = evaluate(tmp_path, split="all", policies=["static:1,10,4"], tune_split="all", latency_dtype="bfloat16")
    assert rep["latency"]["profile_id"] == "29990101-000000-z"


def test_collect_run_key_includes_dtype():
    from pipeline.collect.prompt import CollectConfig

    assert CollectConfig(dtype="float32").run_key() != CollectConfig(dtype="bfloat16").run_key()


def test_device_name_and_fingerprint_name_the_dtype():
    from pipeline.runtime.fingerprint import device_name, environment_fingerprint

    assert device_name("cpu", torch.bfloat16).endswith("torch linear) [bfloat16]")
    assert device_name("cpu", "float32").endswith("linear) [float32]")
    env = environment_fingerprint("cpu", torch.bfloat16)
    assert env["dtype"] == "bfloat16" and env["cpu_model"]


def test_default_cpu_dtype(monkeypatch):
    from pipeline.models import target
    from pipeline.errors import DraftGymError

    monkeypatch.setenv(target.CPU_DTYPE_ENV, "bfloat16")
    assert target.resolve_dtype(None, "cpu") is torch.bfloat16
    assert target.resolve_dtype(None, "cuda") is torch.bfloat16
    monkeypatch.setenv(target.CPU_DTYPE_ENV, "auto")
    monkeypatch.setattr(target, "cpu_has_bf16_units", lambda: False)
    assert target.resolve_dtype(None, "cpu") is torch.float32
    monkeypatch.setattr(target, "cpu_has_bf16_units", lambda: True)
    assert target.resolve_dtype(None, "cpu") is torch.bfloat16
    assert target.resolve_dtype("fp32", "cpu") is torch.float32           # explicit always wins
    monkeypatch.setenv(target.CPU_DTYPE_ENV, "int8")
    with pytest.raises(DraftGymError, match="DRAFTGYM_CPU_DTYPE"):
        target.resolve_dtype(None, "cpu")


def test_emulated_bf16_warns_once(monkeypatch):
    import warnings

    from pipeline.models import target

    monkeypatch.setattr(target, "_WARNED_EMULATED", set())
    monkeypatch.setattr(target, "cpu_has_bf16_units", lambda: False)
    with pytest.warns(RuntimeWarning, match="without bf16 matrix units"):
        assert target.resolve_dtype("bfloat16", "cpu") is torch.bfloat16
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        target.resolve_dtype("bfloat16", "cpu")                            # once per process
        target.resolve_dtype("float32", "cpu")                             # fp32 never warns
        monkeypatch.setattr(target, "_WARNED_EMULATED", set())
        monkeypatch.setattr(target, "cpu_has_bf16_units", lambda: True)
        target.resolve_dtype("bfloat16", "cpu")                            # bf16 units: no warning
        target.resolve_dtype("bfloat16", "cuda")


@pytest.mark.parametrize("cmd", ["generate", "collect", "profile", "train-draft", "validate", "profile-policy"])
def test_every_target_command_takes_dtype(cmd, capsys):
    from online.cli import main

    assert main([cmd, "--help"]) == 0
    assert "--dtype" in capsys.readouterr().out


@pytest.mark.slow
def test_bf16_replay_agrees_with_decoding_until_the_first_divergence():
    """bf16 collection, then bf16 decoding of the same prompts: every cycle whose tokens all come before
    the first token where the decoding parts from the logged continuation accepts what the replay says.
    Not every one bit for bit: online drafts read features from the tree-verify forward, collection
    from one teacher-forced forward (docs/design.md, "Exact counterfactual replay": the float caveat);
    in bf16 that rounding can move a draft score (399 of 401 cycles agreed over 48 tokens on an AMX
    Xeon). Here 32 tokens of three held-out prompts whose decodings stay with the logged
    continuation long enough to compare (on an AVX2-only EPYC, where bf16 is emulated: 77 of 77 cycles;
    mt-bench/81, left out, parts at its first token and gives none)."""
    from pipeline.collect.prompt import CollectConfig, collect_prompt
    from pipeline.decode.controller import StaticController
    from pipeline.datasets import load_prompts
    from pipeline.decode.engine.single import Engine
    from pipeline.models.head import load_head_for
    from pipeline.decode.lossless import first_difference
    from pipeline.models.target import encode_prompt, load_target

    t = load_target("smollm2-135m", dtype="bfloat16")
    head = load_head_for("default", t.model)
    eng = Engine(t.model, head, t.eos_token_ids)
    cfg = CollectConfig(max_new_tokens=32, widths=(10,), max_depth=8, dtype="bfloat16")
    grid = list(cfg.verify_grid)
    agree = total = parted = 0
    recs = [r for r in load_prompts("mt-bench", split="test", n=3) + load_prompts("humaneval", split="test", n=2)
            if r.prompt_id in ("mt-bench/93", "mt-bench/101", "humaneval/HumanEval/27")]
    assert len(recs) == 3
    for r in recs:
        ids = encode_prompt(t.tokenizer, list(r.messages))
        log = collect_prompt(eng, head, ids, cfg)
        acc = log.positions[10]["acceptance"].reshape(-1, cfg.max_depth, len(grid))
        for D, W, V in [(8, 10, 30), (1, 10, 4)]:
            res = eng.generate(ids, cfg.max_new_tokens, controller=StaticController(D, W, V))
            k = first_difference(log.output_tokens[:len(res.output_ids)], res.output_ids)
            parted += k is not None
            k = len(res.output_ids) if k is None else k
            p = 0
            for c in res.cycles:
                if p + c.accepted + 1 >= k:
                    break
                total += 1
                agree += int(acc[p, D - 1, grid.index(V)]) == c.accepted
                p += c.emitted
    assert total >= 50                        # 77 on an AVX2 EPYC
    assert agree >= 0.97 * total, (agree, total)


def test_every_option_of_every_command_has_help():
    """Each subcommand's --help explains every option (and shows its default where it has one)."""
    import argparse

    from online.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for name, sp in sub.choices.items():
        missing = [a.option_strings[0] for a in sp._actions if a.option_strings and not a.help]
        assert not missing, (name, missing)
    assert "(default: smollm2-135m)" in sub.choices["collect"].format_help()


def test_long_commands_take_no_progress():
    """Every command that shows progress bars takes --no-progress (log files and CI get result lines)."""
    import argparse

    from online.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for name in ("collect", "profile", "validate", "profile-policy", "train", "transfer", "train-draft"):
        assert "--no-progress" in sub.choices[name].format_help(), name
    args = build_parser().parse_args(["profile", "--no-progress"])
    assert args.progress is False


def test_log_softmax32_equals_the_upcast_path():
    """pipeline.decode.tree.log_softmax32 casts inside the kernel; its numbers are log_softmax(x.float())'s,
    bit for bit, for bf16, fp16 and fp32 logits (the engine's log-probs, online and in collection)."""
    import torch.nn.functional as F

    from pipeline.decode.tree import log_softmax32

    g = torch.Generator().manual_seed(0)
    for dt in (torch.bfloat16, torch.float16, torch.float32):
        x = (torch.randn(37, 8192, generator=g) * 4).to(dt)
        x[0, :5] = x[0, 5]                                   # ties
        out = log_softmax32(x)
        assert out.dtype == torch.float32 and torch.equal(out, F.log_softmax(x.float(), dim=-1)), dt


def test_level_stats_equals_log_softmax_topk_entropy():
    """pipeline.decode.tree.level_stats (chunked, buffers reused) gives bit for bit the top-k log-probs, ids
    and entropies of log_softmax32 -> topk and -(exp(logp) * logp).sum(-1) on the whole tensor, in
    bf16, fp16 and fp32, for the online shapes ([1, Vd], [1, W, Vd]) and collection's ([64, W, Vd]), whatever the
    chunk size. A wrong chunk boundary or a buffer reused across rows would break equality."""
    from pipeline.decode.tree import level_stats, log_softmax32

    g = torch.Generator().manual_seed(1)
    for dt in (torch.bfloat16, torch.float16, torch.float32):
        for shape in ((1, 8192), (1, 10, 8192), (37, 8192), (64, 10, 8192)):
            x = (torch.randn(*shape, generator=g) * 4).to(dt)
            x.view(-1, shape[-1])[0, :12] = x.view(-1, shape[-1])[0, 12]      # ties inside the top-k
            logp = log_softmax32(x)
            ref_v, ref_i = logp.topk(10, dim=-1)
            ref_h = -(logp.exp() * logp).sum(-1)                       # entropy in nats, as before level_stats
            for rows in (1, 7, 16, 1000):
                v, i, h = level_stats(x, 10, rows=rows)
                assert v.shape == ref_v.shape and h.shape == ref_h.shape, (dt, shape)
                assert torch.equal(v, ref_v) and torch.equal(i, ref_i) and torch.equal(h, ref_h), (dt, shape, rows)


def test_git_commit_marks_uncommitted_code(tmp_path):
    """The fingerprint's commit gets '+dirty' when a tracked file differs from HEAD (a run on uncommitted
    code must not be stamped with a commit that did not produce it); untracked files do not count."""
    import subprocess

    from pipeline.runtime.fingerprint import _git_commit

    git = lambda *a: subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", *a],
                                    check=True, capture_output=True)
    git("init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    git("add", "a.py")
    git("commit", "-qm", "one")
    head = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    (tmp_path / "new.txt").write_text("untracked\n")
    assert _git_commit(str(tmp_path)) == head
    (tmp_path / "a.py").write_text("x = 2\n")
    _git_commit.cache_clear()
    assert _git_commit(str(tmp_path)) == head + "+dirty"
    _git_commit.cache_clear()
    assert _git_commit(str(tmp_path.parent / "no-such-dir")) is None
