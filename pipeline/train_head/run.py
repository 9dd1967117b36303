"""A head-training run's setup (`prepare_run` -> `TrainRun`): the data split, the draft vocabulary,
the head (fresh or warm-started), the optimizer, the feature caches and the step budget. None of it is
checkpointed: a resumed run rebuilds it from the same inputs, and the checkpoint is checked against it
(pipeline/train_head/checkpoint.py). The loop that trains it is pipeline/train_head/loop.py."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from pipeline.errors import DraftGymError
from pipeline.train_head.batches import make_batches
from pipeline.train_head.checkpoint import CHECKPOINT, TrainState
from pipeline.train_head.config import TrainConfig, _hash, parse_curriculum, resolve_amp
from pipeline.train_head.data import TrainSequence
from pipeline.train_head.features import FeatureStore
from pipeline.train_head.initialise import build_draft_vocab, build_head


@dataclass
class TrainRun:
    """Everything a training session works with besides its `TrainState`, built once by `prepare_run`."""
    cfg: TrainConfig
    target_model: object
    dev: torch.device
    amp: bool                          # bf16 autocast
    sequences: list                    # TrainSequence, cut to max_len, each with an answer token
    lengths: list                      # tokens per sequence
    train_idx: list
    val_idx: list
    vocab_size: int                    # the target's
    vocab_ids: torch.Tensor            # [draft_vocab] target ids of the draft vocabulary, sorted
    vocab_stats: dict
    head: object                       # the Eagle3Head being trained
    trainable: list                    # its parameters with requires_grad
    opt: torch.optim.Optimizer
    lm_w_draft: torch.Tensor           # [draft_vocab, H] the target's lm_head rows of the draft vocabulary
    t2draft: torch.Tensor              # [vocab] draft index of each target id, -1 outside the draft vocabulary
    data_hash: str                     # of the sequences' ids: a checkpoint is tied to it
    store: FeatureStore | None         # the training sequences' feature cache
    heldout: list                      # the fixed on-policy held-out sequences (may be empty)
    heldout_hash: str | None
    heldout_store: FeatureStore | None
    per_epoch: int                     # batches per epoch
    total_steps: int | None            # None: only the time budget ends the run
    budget_s: float | None             # the run's total training time over all sessions
    curriculum: list                   # [(progress, TTT steps)]
    ckpt_path: Path

    def progress(self, st: TrainState) -> float:
        """Where the schedule is: max(step / steps, training time / time budget)."""
        p = st.step / self.total_steps if self.total_steps else 0.0
        if self.budget_s:
            p = max(p, st.train_s / self.budget_s)
        return p


def prepare_run(cfg: TrainConfig, target_model, sequences: list[TrainSequence], work_dir: Path,
                heldout: list[TrainSequence]) -> TrainRun:
    """Split the data, build the draft vocabulary and the head (fresh or warm-started), the optimizer,
    the feature caches and the step budget."""
    dev = next(target_model.parameters()).device
    amp = resolve_amp(cfg.amp, dev)
    sequences = _trainable(sequences, cfg.max_len)
    if not sequences:
        raise DraftGymError("no training sequences with an answer")
    lengths = [len(s.ids) for s in sequences]
    train_idx, val_idx = _split(cfg, len(sequences))
    vocab_size = target_model.get_input_embeddings().weight.shape[0]
    head, vocab_ids, vocab_stats = _build_head(cfg, target_model, [sequences[i] for i in train_idx], vocab_size, dev)
    trainable = [p for n, p in head.named_parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay)
    lm_w_draft = target_model.get_output_embeddings().weight[vocab_ids.to(dev)].float().detach()
    t2draft = torch.full((vocab_size,), -1, dtype=torch.long, device=dev)
    t2draft[vocab_ids.to(dev)] = torch.arange(len(vocab_ids), device=dev)

    data_hash = _hash([s.ids for s in sequences])
    fkey = _hash({"model": cfg.model, "seqs": data_hash, "layers": head.layer_ids,
                  "amp": amp, "dtype": str(next(target_model.parameters()).dtype), "v": 1})
    heldout = _trainable(heldout, cfg.max_len)
    heldout_hash = _hash([s.ids for s in heldout]) if heldout else None

    per_epoch = len(make_batches(lengths, train_idx, cfg, 0))
    budget_s = cfg.time_budget_min * 60 if cfg.time_budget_min else None
    epochs = cfg.epochs if cfg.epochs is not None else (None if budget_s else 1.0)
    total_steps = cfg.steps if cfg.steps is not None else (max(1, int(round(epochs * per_epoch))) if epochs else None)
    return TrainRun(cfg=cfg, target_model=target_model, dev=dev, amp=amp, sequences=sequences, lengths=lengths,
                    train_idx=train_idx, val_idx=val_idx, vocab_size=vocab_size, vocab_ids=vocab_ids,
                    vocab_stats=vocab_stats, head=head, trainable=trainable, opt=opt, lm_w_draft=lm_w_draft,
                    t2draft=t2draft, data_hash=data_hash,
                    store=_feature_store(cfg, target_model, work_dir / f"features-{fkey}", lengths),
                    heldout=heldout, heldout_hash=heldout_hash,
                    heldout_store=_feature_store(cfg, target_model, work_dir / f"features-heldout-{heldout_hash}",
                                                 [len(s.ids) for s in heldout]) if heldout else None,
                    per_epoch=per_epoch, total_steps=total_steps, budget_s=budget_s,
                    curriculum=parse_curriculum(cfg.ttt_curriculum, cfg.ttt_steps), ckpt_path=work_dir / CHECKPOINT)


def _split(cfg: TrainConfig, n: int) -> tuple[list[int], list[int]]:
    """(train, val) indices: a seeded random val_fraction of the sequences (at most max_val_sequences;
    none below 20 sequences), each list sorted."""
    perm = np.random.default_rng(cfg.seed).permutation(n).tolist()
    n_val = min(cfg.max_val_sequences, int(n * cfg.val_fraction)) if n >= 20 else 0
    return sorted(perm[n_val:]), sorted(perm[:n_val])


def _build_head(cfg: TrainConfig, target_model, train_seqs: list[TrainSequence], vocab_size: int, dev):
    """The draft vocabulary (the most frequent answer tokens, or a warm-start head's own) and the
    head: fresh from the target (`--init`) or with the weights of `--init-from`.
    Returns (head, vocab_ids, vocab_stats)."""
    vocab_ids, vocab_stats = build_draft_vocab(train_seqs, cfg.draft_vocab_size, vocab_size)
    warm = None
    if cfg.init_from:   # warm start: the head's weights and its own draft vocabulary
        from pipeline.models.head import load_head
        warm = load_head(cfg.init_from, target_model, dtype=torch.float32)
        vocab_ids = warm.draft_to_target(torch.arange(warm.cfg.draft_vocab_size, device=warm.d2t.device)).cpu()
        vocab_stats = {**vocab_stats, "draft_vocab_from": str(cfg.init_from)}
    torch.manual_seed(cfg.seed)
    head = build_head(target_model, vocab_ids, cfg).to(dev)
    if warm is not None:
        missing = head.load_state_dict({k: v for k, v in warm.state_dict().items() if k != "embed_tokens.weight"},
                                       strict=False).missing_keys
        if [k for k in missing if k != "embed_tokens.weight"]:
            raise DraftGymError(f"--init-from {cfg.init_from}: the head lacks {missing[:3]} (another architecture?)")
    return head, vocab_ids, vocab_stats


def _feature_store(cfg: TrainConfig, target_model, path: Path, lengths: list[int]) -> FeatureStore | None:
    if not cfg.feature_cache:
        return None
    H_t = target_model.config.hidden_size
    return FeatureStore(path, lengths, 3 * H_t, H_t)


def _trainable(seqs: list[TrainSequence], max_len: int) -> list[TrainSequence]:
    """The sequences cut to max_len tokens that still hold an answer token (at least 2 tokens)."""
    seqs = [s for s in seqs if len(s.ids) >= 2 and s.prompt_len < len(s.ids)]
    seqs = [TrainSequence(s.ids[:max_len], min(s.prompt_len, max_len), s.source) for s in seqs]
    return [s for s in seqs if s.prompt_len < len(s.ids)]
