"""Batches of training sequences: length-bucketed, deterministic in (seed, epoch), padded."""
from __future__ import annotations

import numpy as np
import torch

from pipeline.train_head.config import TrainConfig
from pipeline.train_head.data import TrainSequence


def make_batches(lengths: list[int], indices: list[int], cfg: TrainConfig, epoch: int) -> list[list[int]]:
    """Length-bucketed batches, deterministic in (seed, epoch): shuffle, sort within chunks of
    ~50 batches by length, cut by batch_size / batch_tokens, shuffle the batch order."""
    rng = np.random.default_rng([cfg.seed, epoch])
    order = [indices[i] for i in rng.permutation(len(indices))]
    chunk = max(cfg.batch_size * 50, 1)
    batches: list[list[int]] = []
    for c in range(0, len(order), chunk):
        part = sorted(order[c:c + chunk], key=lambda i: lengths[i])
        cur: list[int] = []
        for i in part:
            T = max([lengths[j] for j in cur] + [lengths[i]])
            if cur and (len(cur) + 1 > cfg.batch_size or (len(cur) + 1) * T > cfg.batch_tokens):
                batches.append(cur)
                cur = []
            cur.append(i)
        if cur:
            batches.append(cur)
    perm = rng.permutation(len(batches))
    return [batches[i] for i in perm]


def pad_batch(seqs: list[TrainSequence], idx: list[int], device):
    """The sequences `idx` right-padded with 0: (ids [B, T], lengths [B], prompt lengths [B], T)."""
    T = max(len(seqs[i].ids) for i in idx)
    ids = torch.zeros(len(idx), T, dtype=torch.long)
    for r, i in enumerate(idx):
        ids[r, : len(seqs[i].ids)] = torch.tensor(seqs[i].ids)
    lens = torch.tensor([len(seqs[i].ids) for i in idx])
    pl = torch.tensor([seqs[i].prompt_len for i in idx])
    return ids.to(device), lens.to(device), pl.to(device), T
