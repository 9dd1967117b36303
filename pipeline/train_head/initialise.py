"""A fresh head for training: its draft vocabulary, its initialisation from the target, and the
logit-scale calibration that starts its cross-entropy at or below ln(draft vocab)."""
from __future__ import annotations

from collections import Counter

import torch

from pipeline.train_head.data import TrainSequence
from pipeline.errors import DraftGymError
from pipeline.models.head import Eagle3Head, random_head
from pipeline.models.target import base_model
from pipeline.train_head.config import TrainConfig
from pipeline.train_head.ttt import ttt_loss


def build_draft_vocab(sequences: list[TrainSequence], draft_vocab_size: int, vocab_size: int) -> tuple[torch.Tensor, dict]:
    """The `draft_vocab_size` most frequent tokens at answer positions (ties: lower id), sorted by id.
    If the data has fewer distinct tokens, the lowest unused ids fill the rest.
    Returns (target ids [draft_vocab_size] ascending, stats)."""
    if draft_vocab_size > vocab_size:
        raise DraftGymError(f"draft vocab size {draft_vocab_size} > target vocabulary {vocab_size}")
    counts: Counter = Counter()
    for s in sequences:
        counts.update(s.ids[s.prompt_len:])
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    chosen = [t for t, _ in ranked[:draft_vocab_size]]
    if len(chosen) < draft_vocab_size:
        have = set(chosen)
        chosen += [t for t in range(vocab_size) if t not in have][: draft_vocab_size - len(chosen)]
    ids = torch.tensor(sorted(chosen), dtype=torch.long)
    total = sum(counts.values())
    covered = sum(c for t, c in ranked[:draft_vocab_size])
    return ids, {"answer_tokens": total, "distinct_answer_tokens": len(counts),
                 "answer_token_coverage": covered / total if total else 0.0}


def set_draft_vocab(head: Eagle3Head, vocab_ids: torch.Tensor) -> None:
    dev = head.d2t.device
    with torch.no_grad():
        head.d2t.copy_((vocab_ids - torch.arange(len(vocab_ids))).to(dev))
        head.t2d.zero_()
        head.t2d[vocab_ids.to(dev)] = True


def norm_scale(norm: torch.nn.Module) -> torch.Tensor:
    """The per-channel scale [H] (fp32) that the target's final RMSNorm applies, read off the module:
    it maps the all-ones vector (rms 1) to scale / sqrt(1 + eps). So Gemma's parametrisation, scale =
    1 + weight (weight 0 at initialisation), reads as its scale too; copying `weight` itself would
    zero the head's output there (every logit 0)."""
    eps = float(getattr(norm, "variance_epsilon", getattr(norm, "eps", 0.0)))
    ones = torch.ones(1, norm.weight.shape[0], dtype=norm.weight.dtype, device=norm.weight.device)
    return norm(ones)[0].float() * (1.0 + eps) ** 0.5


def build_head(target_model, vocab_ids: torch.Tensor, cfg: TrainConfig) -> Eagle3Head:
    """A fresh fp32 head for `target_model` with the given draft vocabulary, initialised by `cfg.init`:

    - 'random': every weight random (nn.Linear's default), the norms at 1.
    - 'target': lm_head rows = the target's output-embedding rows of the draft tokens, `norm` = the
      scale of the target's final norm (`norm_scale`; the head's hidden state lives in the target's
      residual space, since fc fuses target layers). The other weights stay random, so at step 0 the
      logits are the target's output layer applied to a random fused direction: sharp and wrong
      (a step-0 cross-entropy several times that of the uniform guess).
    - 'passthrough': 'target', plus fc = [0 | 0 | I] (it passes the highest fused target layer through
      unchanged) and o_proj = down_proj = 0, so at initialisation the head's output g_t is that layer's
      hidden state and its logits are the target's own output layer read from layer L-3 (the "logit
      lens"), which already ranks plausible tokens; the attention and MLP start as exact no-ops and get
      gradients from the first step (LoRA-style zero init of the output projections).
    """
    head = random_head(target_model, draft_vocab_size=len(vocab_ids), seed=cfg.seed,
                       intermediate_size=cfg.intermediate_size).float()
    set_draft_vocab(head, vocab_ids)
    if cfg.init in ("target", "passthrough"):
        out_w = target_model.get_output_embeddings().weight
        norm = getattr(base_model(target_model), "norm", None)
        with torch.no_grad():
            if out_w.shape[1] == head.cfg.hidden_size:
                head.lm_head.weight.copy_(out_w[vocab_ids.to(out_w.device)].float())
            if norm is not None and getattr(norm, "weight", None) is not None and norm.weight.shape == head.norm.weight.shape:
                head.norm.weight.copy_(norm_scale(norm))
    if cfg.init == "passthrough":
        H = head.cfg.hidden_size
        with torch.no_grad():
            if head.fc.weight.shape == (H, 3 * H):                      # [H, 3 H_t] with H_t == H
                head.fc.weight.zero_()
                head.fc.weight[:, 2 * H :] = torch.eye(H)
            head.midlayer.self_attn.o_proj.weight.zero_()
            head.midlayer.mlp.down_proj.weight.zero_()
    head.head_id = "train-draft"
    return head.train()


LOGIT_SCALES = (1.0, 0.7, 0.5, 0.35, 0.25, 0.18, 0.12, 0.08, 0.05, 0.0)


@torch.no_grad()
def calibrate_logit_scale(head: Eagle3Head, batch: tuple, K: int, decay: float, amp: bool,
                          target_config=None) -> dict:
    """Scale the fresh head's lm_head by the a in LOGIT_SCALES with the lowest TTT loss on one batch.

    Initialised from the target, the head's logits have the target's sharpness but not yet its
    aim (its input is another position's feature), so the first cross-entropy can be far above
    ln(draft vocab), the loss of a uniform guess, and the first steps are spent shrinking logits.
    Scaling by a keeps the target's ranking and softens it; a = 0 is the uniform guess itself, so
    the chosen scale starts at or below ln(draft vocab) on that batch. batch: ttt_loss's arguments
    from ids to t2draft; target_config: ttt_loss's. Returns {logit_scale, ce_per_step (at it), loss_at_scale}."""
    w0 = head.lm_head.weight.detach().clone()
    res = {}
    for a in LOGIT_SCALES:
        head.lm_head.weight.copy_(w0 * a)
        loss, per_step, _ = ttt_loss(head, *batch, K, decay, amp, target_config=target_config)
        res[a] = (float(loss), per_step)
    best = min(LOGIT_SCALES, key=lambda a: res[a][0])
    head.lm_head.weight.copy_(w0 * best)
    return {"logit_scale": best, "ce_per_step": [round(x, 4) for x in res[best][1]],
            "loss_at_scale": {str(a): round(v[0], 4) for a, v in res.items()}}
