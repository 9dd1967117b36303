"""Target features for head training: the teacher-forced target forward (three fused layers, the
final normed hidden state, the full-vocabulary argmax) and `FeatureStore`, a lazily filled float16
memmap of them, so later epochs skip the target forward."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from pipeline.train_head.data import TrainSequence
from pipeline.models.target import base_model
from pipeline.runtime.atomic import atomic_write, atomic_write_text
from pipeline.train_head.config import _hash


@torch.no_grad()
def target_features(model, ids: torch.Tensor, layer_ids, amp: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Teacher-forced target forward over right-padded ids [B, T] (pads never affect real tokens:
    attention is causal). Returns (fused [B, T, 3H] fp16, final normed hidden [B, T, H] fp16,
    full-vocabulary argmax [B, T] int32)."""
    dev = ids.device
    with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp):
        out = base_model(model)(input_ids=ids, output_hidden_states=True, use_cache=False)
        hs = out.hidden_states
        fused = torch.cat([hs[i] for i in layer_ids], dim=-1)
        final = out.last_hidden_state
        w = model.get_output_embeddings().weight
        b = getattr(model.get_output_embeddings(), "bias", None)
        arg = torch.empty(ids.shape, dtype=torch.int32, device=dev)
        flat, farg = final.reshape(-1, final.shape[-1]), arg.view(-1)
        for s in range(0, flat.shape[0], 1024):     # chunked: full-vocab logits are large
            lg = F.linear(flat[s:s + 1024], w, b)
            farg[s:s + 1024] = lg.argmax(-1).to(torch.int32)
    fp16 = torch.finfo(torch.float16).max
    return fused.float().clamp(-fp16, fp16).half(), final.float().clamp(-fp16, fp16).half(), arg


class FeatureStore:
    """Target features of every sequence in float16 memmaps, filled lazily.

    Files in `root`: fused.f16 [N, 3H], final.f16 [N, H], argmax.i32 [N], done.npy [n_seq] (bool,
    written only after the memmaps are flushed, so a crash can lose work but never corrupt it)."""

    def __init__(self, root: Path, lengths: list[int], fused_dim: int, hidden: int):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        n = int(self.offsets[-1])
        meta = {"lengths_hash": _hash(list(map(int, lengths))), "fused_dim": fused_dim, "hidden": hidden, "n": n}
        meta_path = self.root / "meta.json"
        fresh = not meta_path.is_file() or json.loads(meta_path.read_text()) != meta
        mode = "w+" if fresh else "r+"
        self.fused = np.memmap(self.root / "fused.f16", dtype=np.float16, mode=mode, shape=(max(n, 1), fused_dim))
        self.final = np.memmap(self.root / "final.f16", dtype=np.float16, mode=mode, shape=(max(n, 1), hidden))
        self.argmax = np.memmap(self.root / "argmax.i32", dtype=np.int32, mode=mode, shape=(max(n, 1),))
        done_path = self.root / "done.npy"
        if fresh:
            self.done = np.zeros(len(lengths), dtype=bool)
            np.save(done_path, self.done)
            atomic_write_text(meta_path, json.dumps(meta))
        else:
            self.done = np.load(done_path)
        self._dirty = False

    def get(self, i: int):
        a, b = self.offsets[i], self.offsets[i + 1]
        return (torch.from_numpy(np.asarray(self.fused[a:b])), torch.from_numpy(np.asarray(self.final[a:b])),
                torch.from_numpy(np.asarray(self.argmax[a:b])))

    def put(self, i: int, fused: torch.Tensor, final: torch.Tensor, argmax: torch.Tensor) -> None:
        a, b = self.offsets[i], self.offsets[i + 1]
        self.fused[a:b] = fused.cpu().numpy()
        self.final[a:b] = final.cpu().numpy()
        self.argmax[a:b] = argmax.cpu().numpy()
        self.done[i] = True
        self._dirty = True

    def flush(self) -> None:
        if not self._dirty:
            return
        for m in (self.fused, self.final, self.argmax):
            m.flush()
        atomic_write(self.root / "done.npy", lambda f: np.save(f, self.done))
        self._dirty = False


def batch_features(model, layer_ids, seqs: list[TrainSequence], idx: list[int], T: int, device, amp: bool,
                   store: FeatureStore | None):
    """Features for the batch `idx`, right-padded to T: (fused [B,T,3H], final [B,T,H], argmax [B,T])
    as float32/long on `device`, read from `store` where cached, else computed (and cached)."""
    B = len(idx)
    todo = [j for j, i in enumerate(idx) if store is None or not store.done[i]]
    parts: dict[int, tuple] = {}
    if todo:
        Tt = max(len(seqs[idx[j]].ids) for j in todo)
        ids = torch.zeros(len(todo), Tt, dtype=torch.long)
        for r, j in enumerate(todo):
            s = seqs[idx[j]].ids
            ids[r, : len(s)] = torch.tensor(s)
        fu, fi, am = target_features(model, ids.to(device), layer_ids, amp)
        for r, j in enumerate(todo):
            n = len(seqs[idx[j]].ids)
            parts[j] = (fu[r, :n], fi[r, :n], am[r, :n])
            if store is not None:
                store.put(idx[j], *parts[j])
    for j, i in enumerate(idx):
        if j not in parts:
            parts[j] = store.get(i)
    fd, hd = parts[0][0].shape[-1], parts[0][1].shape[-1]
    fused = torch.zeros(B, T, fd, dtype=torch.float16)
    final = torch.zeros(B, T, hd, dtype=torch.float16)
    arg = torch.zeros(B, T, dtype=torch.long)
    for j in range(B):
        fu, fi, am = parts[j]
        n = fu.shape[0]
        fused[j, :n], final[j, :n], arg[j, :n] = fu.cpu(), fi.cpu(), am.cpu().long()
    return fused.to(device).float(), final.to(device).float(), arg.to(device)
