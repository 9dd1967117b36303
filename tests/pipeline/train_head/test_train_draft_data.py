"""`draftgym train-draft` without training a head: the TTT mask, the draft vocabulary, deterministic
batches, the dataset allocation, the CLI, the TTT curriculum and frozen datasets."""
from __future__ import annotations


import pytest
import torch

from pipeline.train_head.batches import make_batches
from pipeline.train_head.data import TrainSequence, allocate, parse_dataset_spec
from pipeline.train_head.initialise import build_draft_vocab, build_head
from pipeline.train_head.ttt import ttt_mask
from tests.pipeline.train_head.test_train_draft import _cfg, _sharp_tiny_llama

VOCAB = 128


def test_ttt_mask_structure():
    m = ttt_mask(T=6, t0=2, K=3, dtype=torch.float32, device="cpu")
    assert m.shape == (4, 6 + 2 * 4)
    allowed = m == 0
    for r in range(4):
        t = 2 + r
        assert allowed[r, :6].tolist() == [c <= t for c in range(6)]
        for blk in range(2):
            assert allowed[r, 6 + 4 * blk: 10 + 4 * blk].tolist() == [c == r for c in range(4)]


# ----------------------------------------------------------------------------- saving and loading

def test_draft_vocab_is_most_frequent_answer_tokens():
    seqs = [TrainSequence([100, 101, 5, 5, 5, 7, 7, 9], 2), TrainSequence([100, 3, 7, 5], 1)]
    ids, stats = build_draft_vocab(seqs, 3, 128)
    assert ids.tolist() == [3, 5, 7]                  # 5 x4, 7 x3, then 3 and 9 tie (x1): lower id wins
    assert stats["answer_tokens"] == 9 and abs(stats["answer_token_coverage"] - 8 / 9) < 1e-9
    model = _sharp_tiny_llama()
    head = build_head(model, ids, _cfg(draft_vocab_size=3))
    assert head.draft_to_target(torch.arange(3)).tolist() == [3, 5, 7]
    assert head.t2d.nonzero().flatten().tolist() == [3, 5, 7]
    # lm_head starts as the target's output rows of those tokens
    assert torch.equal(head.lm_head.weight, model.lm_head.weight[ids])


def test_batches_are_deterministic_and_cover_everything():
    cfg = _cfg(batch_size=4, batch_tokens=40)
    lengths = [5, 30, 12, 8, 9, 10, 3, 20, 7, 7]
    b1 = make_batches(lengths, list(range(10)), cfg, epoch=0)
    assert b1 == make_batches(lengths, list(range(10)), cfg, epoch=0)
    assert sorted(i for b in b1 for i in b) == list(range(10))
    assert all(len(b) <= 4 and len(b) * max(lengths[i] for i in b) <= 40 or len(b) == 1 for b in b1)


def test_dataset_allocation():
    assert parse_dataset_spec("sharegpt,gsm8k:300") == [("sharegpt", None), ("gsm8k", 300)]
    sizes = {"sharegpt": 13902, "humaneval": 131, "mt-bench": 65, "gsm8k": 1075}
    a = allocate(1000, sizes, {})
    assert a["mt-bench"] == 65 and a["humaneval"] == 131 and sum(a.values()) == 1000
    assert abs(a["sharegpt"] - a["gsm8k"]) <= 1
    assert allocate(10, sizes, {"gsm8k": 4}) == {"gsm8k": 4, "mt-bench": 2, "humaneval": 2, "sharegpt": 2}


def test_cli_registers_train_draft():
    from online.cli import build_parser

    args = build_parser().parse_args(["train-draft", "--dataset", "sharegpt,gsm8k", "--n-prompts", "10",
                                      "--out", "x", "--ttt-steps", "3", "--time-budget-min", "5"])
    cfg = args.make_config(args)
    assert cfg.datasets == ("sharegpt", "gsm8k") and cfg.n_prompts == 10 and cfg.ttt_steps == 3
    assert cfg.time_budget_min == 5 and cfg.draft_vocab_size == 8192
    assert cfg.feature_cache and cfg.init == "passthrough" and cfg.ttt_curriculum == ()
    args = build_parser().parse_args(["train-draft", "--out", "x", "--no-feature-cache", "--no-init-from-target",
                                      "--ttt-curriculum", "4@0, 7@0.5"])
    cfg = args.make_config(args)
    assert not cfg.feature_cache and cfg.init == "random" and cfg.ttt_curriculum == ("4@0", "7@0.5")


# ----------------------------------------------------------------------------- head retraining: init, resume, data, curriculum

def test_ttt_curriculum():
    from pipeline.errors import DraftGymError
    from pipeline.train_head.config import parse_curriculum, ttt_steps_at

    cur = parse_curriculum("2@0,4@0.5", 4)
    assert cur == [(0.0, 2), (0.5, 4)]
    assert [ttt_steps_at(cur, 4, p) for p in (0.0, 0.49, 0.5, 0.99)] == [2, 2, 4, 4]
    assert ttt_steps_at([], 7, 0.3) == 7
    for bad, msg in (("4@0.2", "start at 0"), ("2@0,3@0.5,4@0.4", "increase"), ("9@0", "1..ttt_steps"), ("x", "K@FRACTION")):
        with pytest.raises(DraftGymError, match=msg):
            parse_curriculum(bad, 4)


def test_frozen_dataset_roundtrip_and_bad_files(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.errors import DraftGymError
    from pipeline.train_head.data import freeze_sequences, load_frozen

    seqs = [TrainSequence([1, 2, 3, 4], 2, "a/1"), TrainSequence([5, 6], 1, "ref:b/2")]
    info = freeze_sequences(seqs, tmp_path / "d.parquet", {"datasets": {"a": 1}})
    got, meta = load_frozen(tmp_path / "d.parquet")
    assert got == seqs and meta == {"datasets": {"a": 1}} and info["sequences"] == 2 and info["tokens"] == 6
    assert len(info["sha256"]) == 64
    with pytest.raises(DraftGymError, match="no such file"):
        load_frozen(tmp_path / "missing.parquet")
    (tmp_path / "junk.parquet").write_bytes(b"not parquet")
    with pytest.raises(DraftGymError, match="not a readable Parquet file"):
        load_frozen(tmp_path / "junk.parquet")
    pq.write_table(pa.table({"x": [1]}), tmp_path / "other.parquet")
    with pytest.raises(DraftGymError, match="not a DraftGym training dataset"):
        load_frozen(tmp_path / "other.parquet")
