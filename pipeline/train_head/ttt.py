"""Training-time test (TTT): the unrolled draft steps of one training batch and their loss, in the
positions `pipeline.decode.draft` / `pipeline.decode.engine.single` use at inference (see `ttt_loss`), and
the loss and accuracy over a set of sequences (`ttt_metrics`: held-out and validation metrics)."""
from __future__ import annotations

import numpy as np
import torch

from pipeline.models.arch import output_logits
from pipeline.models.head import Eagle3Head
from pipeline.train_head.batches import make_batches, pad_batch
from pipeline.train_head.config import TrainConfig
from pipeline.train_head.features import batch_features


def ttt_mask(T: int, t0: int, K: int, dtype, device) -> torch.Tensor:
    """Additive mask [Tq, T + (K-1)*Tq], Tq = T - t0, for steps >= 1 over the index window
    t = t0 .. T-1: block 0 (step-0 keys, all T indices) is causal (key index <= t); each later
    block (one per step 1..K-1, over the window) is the diagonal (same index t). Step i uses the
    first T + i*Tq columns."""
    Tq = T - t0
    t = torch.arange(t0, T, device=device)
    allowed = [torch.arange(T, device=device)[None, :] <= t[:, None]]
    eye = torch.eye(Tq, dtype=torch.bool, device=device)
    allowed += [eye] * (K - 1)
    allowed = torch.cat(allowed, dim=1)
    m = torch.zeros(allowed.shape, dtype=dtype, device=device)
    return m.masked_fill_(~allowed, float("-inf"))


def ttt_loss(head: Eagle3Head, ids: torch.Tensor, lens: torch.Tensor, prompt_lens: torch.Tensor,
             fused: torch.Tensor, final: torch.Tensor, argmax: torch.Tensor, lm_w_draft: torch.Tensor,
             t2draft: torch.Tensor, K: int, decay: float, amp: bool, capture: list | None = None,
             target_config=None):
    """Training-time test over a right-padded batch. ids [B, T]; lens, prompt_lens [B];
    fused [B, T, 3H_t]; final [B, T, H_t] (target's normed last hidden); argmax [B, T] (target's
    full-vocab argmax); lm_w_draft [Vd, H_t] (target output rows of the draft vocabulary);
    t2draft [vocab] (draft index or -1); target_config: the target's config, whose transform of the
    lm_head's logits (Gemma-2's soft-capping: pipeline.models.arch.output_logits) the labels get too.
    Returns (weighted loss, per-step loss list, per-step (correct, count) list). With `capture` (a list),
    appends per step (indices t, logits [B, len(t), Vd]).

    Cost: the soft labels are computed once per batch, at the positions some step is labelled from
    (p such that x_{p+1} is an answer token whose target argmax is in the draft vocabulary), not once
    per step; and the head's lm_head runs only on the rows that have a label (no prompt or padding row)."""
    B, T = ids.shape
    dev = ids.device
    dtype = torch.bfloat16 if amp else fused.dtype
    # steps >= 1 run only where some step's target can still be an answer token: t >= min(prompt_len) - K - 1
    t0 = max(0, min(int(prompt_lens.min()) - K - 1, T - 1))
    Tq = T - t0
    pos_all = torch.arange(T, device=dev)
    pad = torch.zeros(B, K + 1, dtype=ids.dtype, device=dev)
    ids_pad = torch.cat([ids, pad], dim=1)                              # x_{t+1+i} for t+1+i >= T reads 0
    # labels, once: position p is labelled when x_{p+1} is an answer token inside the sequence and the
    # target's argmax at p is a draft token; its label is softmax(target logits at p) over the draft vocabulary
    lab_all = t2draft[argmax]                                           # [B, T] draft index or -1
    nxt = pos_all + 1
    has = (nxt[None] < lens[:, None]) & (nxt[None] >= prompt_lens[:, None]) & (lab_all >= 0)   # [B, T]
    lb, lp = has.nonzero(as_tuple=True)                                 # [n_lab]
    row_of = torch.full((B, T), -1, dtype=torch.long, device=dev)
    row_of[lb, lp] = torch.arange(lb.numel(), device=dev)
    with torch.autocast(dev.type, enabled=False):
        z = final[lb, lp].float() @ lm_w_draft.T                        # [n_lab, Vd] (fp32) lm_head logits
        tp_all = torch.softmax(z if target_config is None else output_logits(target_config, z), dim=-1)
    losses, stats = [], []
    total = torch.zeros((), device=dev)
    ks, vs, mask = [], [], None
    with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp):
        hidden = head.fuse_concat(fused)                                # [B, T, H] (fc_norm too, if the head has it)
        for i in range(K):
            if i == 0:
                idx = pos_all
                g, _, (k, v) = head(ids_pad[:, 1:T + 1], hidden, idx, logits=False)
            else:
                if mask is None:
                    mask = ttt_mask(T, t0, K, dtype, dev)
                idx = pos_all[t0:]
                past = (torch.cat(ks, 2), torch.cat(vs, 2))
                g, _, (k, v) = head(ids_pad[:, t0 + 1 + i:T + 1 + i], hidden, idx + i, past_kv=past,
                                    attn_mask=mask[:, : T + i * Tq], logits=False)
            ks.append(k)
            vs.append(v)
            if capture is not None:
                capture.append((idx.detach().clone(), head.logits_of(g).detach().float()))
            # step i at index t predicts x_{t+2+i}; label = target distribution at position p = t+1+i
            p = idx + 1 + i                                             # [Tq_i]
            valid = has[:, p.clamp(max=T - 1)] & (p < T)[None]          # [B, Tq_i]
            b_idx, r_idx = valid.nonzero(as_tuple=True)
            n = int(b_idx.numel())
            if n:
                lg = head.logits_of(g[b_idx, r_idx]).float()            # [n, Vd]: labelled rows only
                rows = row_of[b_idx, p[r_idx]]                          # [n] rows of tp_all
                with torch.autocast(dev.type, enabled=False):
                    li = -(tp_all[rows] * torch.log_softmax(lg, dim=-1)).sum(-1).mean()
                correct = int((lg.argmax(-1) == lab_all[b_idx, p[r_idx]]).sum())
                total = total + (decay ** i) * li
                losses.append(float(li.detach()))
            else:
                losses.append(float("nan"))
                correct = 0
            stats.append((correct, n))
            hidden = g[:, t0:] if i == 0 else g
    return total, losses, stats


@torch.no_grad()
def ttt_metrics(head, target_model, sequences, idx_list, cfg: TrainConfig, lm_w_draft, t2draft, amp, store) -> dict:
    """Mean TTT loss (decay-weighted over steps) and per-step accuracy over the sequences `idx_list`
    (no gradients): the held-out curve and the final validation metrics."""
    dev = lm_w_draft.device
    K = cfg.ttt_steps
    lsum, lcount = np.zeros(K), np.zeros(K)
    correct, count = np.zeros(K), np.zeros(K)
    lengths = [len(s.ids) for s in sequences]
    for b in make_batches(lengths, idx_list, cfg, 1 << 20):
        ids, lens, pl, T = pad_batch(sequences, b, dev)
        fused, final, am = batch_features(target_model, head.layer_ids, sequences, b, T, dev, amp, store)
        _, losses, stats = ttt_loss(head, ids, lens, pl, fused, final, am, lm_w_draft, t2draft, K, cfg.ttt_decay, amp,
                                    target_config=target_model.config)
        for i, ((c, n), li) in enumerate(zip(stats, losses)):
            correct[i] += c
            count[i] += n
            if n:
                lsum[i] += li * n
                lcount[i] += n
    per_step = lsum / np.maximum(lcount, 1)
    w = np.array([cfg.ttt_decay ** i for i in range(K)])
    return {"loss": float((w * per_step).sum()), "loss_per_step": [round(float(x), 4) for x in per_step],
            "acc": [round(float(a), 4) for a in correct / np.maximum(count, 1)], "positions": [int(c) for c in count]}
