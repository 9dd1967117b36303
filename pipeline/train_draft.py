"""`draftgym train-draft`: train an EAGLE-3 draft head for a target (self-distillation + TTT).

Pipeline (SpecForge-style, one file, CleanRL-style hyperparameters in `TrainConfig`):

  1. Self-distillation. The target regenerates greedy answers to the train-split prompts (batched,
     `pipeline.batch_generate`: slots refilled from the queue). Answers are appended to a JSONL cache
     per generation setting, so a killed run resumes where it stopped.
  2. Draft vocabulary. The `draft_vocab_size` most frequent target tokens at response positions,
     sorted by id; `d2t[i] = target_id(i) - i`, `t2d` = membership mask over the target vocabulary.
  3. Features. The target runs teacher-forced over prompt + answer (bf16 autocast where the hardware
     has fast bf16) and gives the three fused layers (`head.layer_ids`), the final normed hidden
     state (from which the target's soft labels over the draft vocabulary are computed) and the
     full-vocabulary argmax (for the mask). They are computed on the fly the first time a sequence
     is seen and written into a float16 numpy memmap (`FeatureStore`); later epochs read them. On a
     2-core CPU the teacher-forced target forward costs about as much as 3-4 TTT steps of the head,
     so a lazily filled cache makes epoch 1 cost no more than on-the-fly features and every later
     epoch ~30-40% cheaper, at 4.6 KB/token of disk. Features always pass through float16 (also
     when freshly computed), so cached and uncached batches train identically.
  4. Training-time test (TTT), matching `pipeline.engine` / `pipeline.draft` at inference:
       step 0, index t: (fc(f_t), x_{t+1}) at position t, causal over step-0 entries <= t;
       step i >= 1, index t: (g^{(i-1)}_t, x_{t+1+i}) at position t+i, attending to step-0 keys
       <= t and to the step-1..i entries of the same index t (itself included).
     Step i predicts x_{t+2+i}; its label is softmax(target logits at position t+1+i) restricted to
     the draft vocabulary. A term counts only when x_{t+2+i} is a response token inside the
     sequence and the target's argmax at t+1+i is in the draft vocabulary. Loss = sum_i
     0.8^i * mean soft cross-entropy of step i. TTT runs with `past_kv` = [step-0 keys | earlier
     steps' keys] and one additive mask per batch; steps >= 1 only run the window of indices that
     can still reach a response token.
  5. AdamW (0.9, 0.95), linear warm-up then cosine decay, grad-norm clip 0.5. The schedule runs on
     `progress` = max(step / steps, train-time / time budget), so a time-budgeted run decays fully
     by its deadline. Checkpoints (head + optimizer + step + data position + elapsed time + RNG)
     are written atomically every `checkpoint_every` steps / `checkpoint_every_min` minutes and at
     the end; `--resume` continues from the last one.
  6. Output: the official head format via `save_head` (config.json + model.safetensors, weights
     stored as bfloat16) and `manifest.json` (data, sizes, steps, curve, final metrics,
     environment fingerprint).

`train_head` is the core and takes pre-tokenized sequences, so tests need no tokenizer.
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
import os
import random
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from pipeline.errors import DraftGymError
from pipeline.head import Eagle3Head, num_params, random_head, save_head

MANIFEST_VERSION = 1


# ------------------------------------------------------------------------------ hyperparameters

@dataclass
class TrainConfig:
    """Every knob of `draftgym train-draft` (the CLI flags map 1:1 onto these fields)."""

    # -- data / self-distillation
    model: str = "smollm2-135m"             # target: 'smollm2-135m', a HF dir or a hub id
    dtype: str = "float32"                   # the target's dtype for training features (bfloat16: what a bf16
                                             # deployment feeds the head); answers come from the gen_dtype copy
    datasets: tuple = ("sharegpt",)          # names, optionally 'name:count' to fix a dataset's share
    n_prompts: int = 2000                    # train-split prompts in total, shared evenly (water-filling)
    max_prompt_tokens: int = 256             # longer prompts are skipped (never truncated)
    max_new_tokens: int = 256                # regenerated answer length (greedy)
    gen_batch_size: int = 32                 # prompts per batched generate call
    gen_dtype: str = "bfloat16"              # dtype of the generation copy of the target
    regen_budget_min: float | None = None    # stop regenerating after this long and train on what is done
    reference_prompts: int = 0               # extra train prompts trained on with the dataset's own reference
                                             # answer as text (labels are still the target's distributions)
    reference_datasets: tuple = ("sharegpt",)  # where those come from (records that have a reference)
    max_len: int = 512                       # prompt + answer tokens kept per training sequence
    # -- head
    draft_vocab_size: int = 8192
    intermediate_size: int | None = None     # None: the target's (smaller trains faster; recorded in config)
    init_lm_head_from_target: bool = True    # lm_head rows / final norm start as the target's
    # -- training-time test
    ttt_steps: int = 7                       # unrolled draft steps (EAGLE-3 uses 7)
    ttt_decay: float = 0.8                   # loss weight of step i is decay**i
    # -- optimisation
    steps: int | None = None                 # optimizer steps; None: `epochs` passes over the data
    epochs: float | None = None              # None: 1 epoch, or unlimited when a time budget is given
    time_budget_min: float | None = None     # stop (and save) after this much training time (whichever first)
    batch_size: int = 16                     # max sequences per batch
    batch_tokens: int = 4096                 # max padded tokens per batch (length-bucketed batches)
    lr: float = 5e-4                         # peak learning rate (small heads, short runs: > the 5e-5 of 8B heads)
    min_lr_ratio: float = 0.05               # cosine floor, as a fraction of lr
    warmup_steps: int = 50
    betas: tuple = (0.9, 0.95)
    weight_decay: float = 0.0
    grad_clip: float = 0.5
    amp: str = "auto"                        # 'auto' (bf16 on cuda / on CPUs with bf16), 'bf16', 'none'
    feature_cache: bool = True               # lazily filled float16 memmap of target features
    val_fraction: float = 0.03               # held-out sequences for the final evaluation
    max_val_sequences: int = 64
    # -- bookkeeping
    seed: int = 0
    device: str | None = None                # default: cuda when available, else cpu
    out: str = ""                            # head directory (config.json, model.safetensors, manifest.json)
    work_dir: str | None = None              # caches + checkpoints; default $DRAFTGYM_CACHE/train-draft/<model>
    resume: bool = False
    checkpoint_every: int = 500
    checkpoint_every_min: float = 10.0
    log_every: int = 25

    def validate(self) -> None:
        if not self.out:
            raise DraftGymError("train-draft needs --out DIR")
        for name in ("n_prompts", "max_new_tokens", "max_len", "draft_vocab_size", "ttt_steps", "batch_size",
                     "batch_tokens", "gen_batch_size"):
            if int(getattr(self, name)) < 1:
                raise DraftGymError(f"{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.steps is not None and self.steps < 1:
            raise DraftGymError(f"steps must be >= 1, got {self.steps}")
        if self.lr <= 0:
            raise DraftGymError(f"lr must be > 0, got {self.lr}")
        if self.amp not in ("auto", "bf16", "none"):
            raise DraftGymError(f"amp must be auto, bf16 or none, got {self.amp!r}")
        if self.time_budget_min is not None and self.time_budget_min <= 0:
            raise DraftGymError(f"time budget must be > 0 minutes, got {self.time_budget_min}")


@dataclass
class TrainSequence:
    """One training sequence: prompt + answer token ids; positions >= prompt_len are the answer."""

    ids: list[int]
    prompt_len: int
    source: str = ""


# ------------------------------------------------------------------------------ small helpers

def _hash(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:12]


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name.strip("/").replace("/", "--"))[:80]


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _atomic_torch_save(obj, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def resolve_amp(amp: str, device: torch.device) -> bool:
    """bf16 autocast on cuda; on a CPU only when it has native bf16 (AVX512-BF16 / AMX), where
    bf16 matmuls run ~3x faster than fp32 (measured on the 2-core dev box)."""
    if amp == "none":
        return False
    if amp == "bf16" or device.type == "cuda":
        return True
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except Exception:
        return False


def _base_model(model):
    return getattr(model, model.base_model_prefix, model)


def lr_at(cfg: TrainConfig, step: int, progress: float) -> float:
    """Linear warm-up over `warmup_steps`, then cosine from lr to lr*min_lr_ratio over progress."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    p = min(max(progress, 0.0), 1.0)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * p)))


# ------------------------------------------------------------------------------ draft vocabulary

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


def build_head(target_model, vocab_ids: torch.Tensor, cfg: TrainConfig) -> Eagle3Head:
    """A fresh fp32 head for `target_model` with the given draft vocabulary.

    With `init_lm_head_from_target` the head's lm_head rows start as the target's output embedding
    rows of the draft tokens and its final norm as the target's final norm: the head's hidden state
    lives in the target's residual space (fc fuses target layers), so this is a warm start."""
    head = random_head(target_model, draft_vocab_size=len(vocab_ids), seed=cfg.seed,
                       intermediate_size=cfg.intermediate_size).float()
    set_draft_vocab(head, vocab_ids)
    if cfg.init_lm_head_from_target:
        out_w = target_model.get_output_embeddings().weight
        norm = getattr(_base_model(target_model), "norm", None)
        with torch.no_grad():
            if out_w.shape[1] == head.cfg.hidden_size:
                head.lm_head.weight.copy_(out_w[vocab_ids.to(out_w.device)].float())
            if norm is not None and getattr(norm, "weight", None) is not None and norm.weight.shape == head.norm.weight.shape:
                head.norm.weight.copy_(norm.weight.float())
    head.head_id = "train-draft"
    return head.train()


# ------------------------------------------------------------------------------ target features

@torch.no_grad()
def target_features(model, ids: torch.Tensor, layer_ids, amp: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Teacher-forced target forward over right-padded ids [B, T] (pads never affect real tokens:
    attention is causal). Returns (fused [B, T, 3H] fp16, final normed hidden [B, T, H] fp16,
    full-vocabulary argmax [B, T] int32)."""
    dev = ids.device
    with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp):
        out = _base_model(model)(input_ids=ids, output_hidden_states=True, use_cache=False)
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
            _atomic_write_text(meta_path, json.dumps(meta))
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
        tmp = self.root / "done.tmp.npy"
        np.save(tmp, self.done)
        os.replace(tmp, self.root / "done.npy")
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


# ------------------------------------------------------------------------------ the TTT step

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
             t2draft: torch.Tensor, K: int, decay: float, amp: bool, capture: list | None = None):
    """Training-time test over a right-padded batch. ids [B, T]; lens, prompt_lens [B];
    fused [B, T, 3H_t]; final [B, T, H_t] (target's normed last hidden); argmax [B, T] (target's
    full-vocab argmax); lm_w_draft [Vd, H_t] (target output rows of the draft vocabulary);
    t2draft [vocab] (draft index or -1). Returns (weighted loss, per-step loss list, per-step
    (correct, count) list). With `capture` (a list), appends per step (indices t, logits [B, len(t), Vd])."""
    B, T = ids.shape
    dev = ids.device
    dtype = torch.bfloat16 if amp else fused.dtype
    # steps >= 1 run only where some step's target can still be an answer token: t >= min(prompt_len) - K - 1
    t0 = max(0, min(int(prompt_lens.min()) - K - 1, T - 1))
    Tq = T - t0
    pos_all = torch.arange(T, device=dev)
    pad = torch.zeros(B, K + 1, dtype=ids.dtype, device=dev)
    ids_pad = torch.cat([ids, pad], dim=1)                              # x_{t+1+i} for t+1+i >= T reads 0
    losses, stats = [], []
    total = torch.zeros((), device=dev)
    ks, vs, mask = [], [], None
    with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp):
        hidden = head.fuse_concat(fused)                                # [B, T, H] (fc_norm too, if the head has it)
        for i in range(K):
            if i == 0:
                idx = pos_all
                g, logits, (k, v) = head(ids_pad[:, 1:T + 1], hidden, idx)
            else:
                if mask is None:
                    mask = ttt_mask(T, t0, K, dtype, dev)
                idx = pos_all[t0:]
                past = (torch.cat(ks, 2), torch.cat(vs, 2))
                g, logits, (k, v) = head(ids_pad[:, t0 + 1 + i:T + 1 + i], hidden, idx + i, past_kv=past,
                                         attn_mask=mask[:, : T + i * Tq])
            ks.append(k)
            vs.append(v)
            if capture is not None:
                capture.append((idx.detach().clone(), logits.detach().float()))
            # step i at index t predicts x_{t+2+i}; label = target distribution at position p = t+1+i
            tgt_pos = idx + 2 + i                                       # [Tq_i]
            p = (idx + 1 + i).clamp(max=T - 1)
            am = argmax[:, p]                                           # [B, Tq_i]
            lab = t2draft[am]
            valid = (tgt_pos[None] < lens[:, None]) & (tgt_pos[None] >= prompt_lens[:, None]) & (lab >= 0)
            n = int(valid.sum())
            if n:
                b_idx, r_idx = valid.nonzero(as_tuple=True)
                lg = logits[b_idx, r_idx].float()                      # [n, Vd]
                with torch.autocast(dev.type, enabled=False):
                    tl = final[b_idx, p[r_idx]] @ lm_w_draft.T          # [n, Vd] target logits (fp32)
                    tp = torch.softmax(tl, dim=-1)
                    logq = torch.log_softmax(lg, dim=-1)
                    li = -(tp * logq).sum(-1).mean()
                correct = int((lg.argmax(-1) == lab[b_idx, r_idx]).sum())
                total = total + (decay ** i) * li
                losses.append(float(li.detach()))
            else:
                losses.append(float("nan"))
                correct = 0
            stats.append((correct, n))
            hidden = g[:, t0:] if i == 0 else g
    return total, losses, stats


# ------------------------------------------------------------------------------ batching

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


def _pad_batch(seqs: list[TrainSequence], idx: list[int], device):
    T = max(len(seqs[i].ids) for i in idx)
    ids = torch.zeros(len(idx), T, dtype=torch.long)
    for r, i in enumerate(idx):
        ids[r, : len(seqs[i].ids)] = torch.tensor(seqs[i].ids)
    lens = torch.tensor([len(seqs[i].ids) for i in idx])
    pl = torch.tensor([seqs[i].prompt_len for i in idx])
    return ids.to(device), lens.to(device), pl.to(device), T


# ------------------------------------------------------------------------------ the trainer core

@dataclass
class _State:
    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    train_s: float = 0.0
    tokens_seen: int = 0
    curve: list = field(default_factory=list)


class _Stop:
    """SIGTERM / SIGINT -> finish the current step, checkpoint, save the head, exit."""

    def __init__(self):
        self.flag = False
        self._old = {}

    def __enter__(self):
        import threading
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.flag:  # second signal: give up at once
            raise KeyboardInterrupt
        self.flag = True

    def __exit__(self, *exc):
        for sig, h in self._old.items():
            signal.signal(sig, h)


def _log(msg: str) -> None:
    print(f"[train-draft {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _ckpt_compat(cfg: TrainConfig) -> dict:
    """Fields a checkpoint must agree on to be resumed."""
    keys = ("model", "dtype", "draft_vocab_size", "intermediate_size", "ttt_steps", "max_len", "seed", "batch_size",
            "batch_tokens", "init_lm_head_from_target")
    return {k: getattr(cfg, k) for k in keys}


def train_head(cfg: TrainConfig, target_model, sequences: list[TrainSequence], out_dir: str | Path,
               work_dir: str | Path, data_info: dict | None = None, progress_bar: bool = True,
               callback=None) -> dict:
    """Train an EAGLE-3 head on pre-tokenized sequences; write the head + manifest to out_dir.

    Checkpoints and the feature cache live in work_dir. `callback(step)` is called after every
    optimizer step; returning True stops the run as an interruption would (checkpoint + head).
    Returns the manifest dict (plus the trained fp32 head under "_head")."""
    from tqdm import tqdm

    from pipeline.fingerprint import environment_fingerprint

    t_start = time.time()
    out_dir, work_dir = Path(out_dir), Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    dev = next(target_model.parameters()).device
    amp = resolve_amp(cfg.amp, dev)
    sequences = [s for s in sequences if len(s.ids) >= 2 and s.prompt_len < len(s.ids)]
    sequences = [TrainSequence(s.ids[: cfg.max_len], min(s.prompt_len, cfg.max_len), s.source) for s in sequences]
    sequences = [s for s in sequences if s.prompt_len < len(s.ids)]
    if not sequences:
        raise DraftGymError("no training sequences with an answer")
    lengths = [len(s.ids) for s in sequences]
    rng = np.random.default_rng(cfg.seed)
    perm = rng.permutation(len(sequences)).tolist()
    n_val = min(cfg.max_val_sequences, int(len(sequences) * cfg.val_fraction)) if len(sequences) >= 20 else 0
    val_idx, train_idx = sorted(perm[:n_val]), sorted(perm[n_val:])
    vocab_size = target_model.get_input_embeddings().weight.shape[0]
    vocab_ids, vocab_stats = build_draft_vocab([sequences[i] for i in train_idx], cfg.draft_vocab_size, vocab_size)

    torch.manual_seed(cfg.seed)
    head = build_head(target_model, vocab_ids, cfg).to(dev)
    trainable = [p for n, p in head.named_parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay)
    lm_w_draft = target_model.get_output_embeddings().weight[vocab_ids.to(dev)].float().detach()
    t2draft = torch.full((vocab_size,), -1, dtype=torch.long, device=dev)
    t2draft[vocab_ids.to(dev)] = torch.arange(len(vocab_ids), device=dev)

    store = None
    if cfg.feature_cache:
        fkey = _hash({"model": cfg.model, "seqs": _hash([s.ids for s in sequences]), "layers": head.layer_ids,
                      "amp": amp, "dtype": str(next(target_model.parameters()).dtype), "v": 1})
        H_t = target_model.config.hidden_size
        store = FeatureStore(work_dir / f"features-{fkey}", lengths, 3 * H_t, H_t)

    per_epoch = len(make_batches(lengths, train_idx, cfg, 0))
    budget_s = cfg.time_budget_min * 60 if cfg.time_budget_min else None
    epochs = cfg.epochs if cfg.epochs is not None else (None if budget_s else 1.0)
    total_steps = cfg.steps if cfg.steps is not None else (max(1, int(round(epochs * per_epoch))) if epochs else None)

    st = _State()
    ckpt_path = work_dir / "checkpoint.pt"
    if cfg.resume and ckpt_path.is_file():
        ck = torch.load(ckpt_path, map_location="cpu", weights_only=False)
        if ck.get("compat") != _ckpt_compat(cfg):
            raise DraftGymError(f"checkpoint {ckpt_path} was made with other settings ({ck.get('compat')}); "
                                "drop --resume or use another --work-dir")
        if not torch.equal(ck["vocab_ids"], vocab_ids):
            raise DraftGymError(f"checkpoint {ckpt_path} has another draft vocabulary (other data?)")
        head.load_state_dict(ck["head"], strict=False)
        opt.load_state_dict(ck["optimizer"])
        st = _State(**ck["state"])
        torch.set_rng_state(ck["rng"]["torch"])
        np.random.set_state(ck["rng"]["numpy"])
        random.setstate(ck["rng"]["python"])
        _log(f"resumed from {ckpt_path} at step {st.step} (epoch {st.epoch}, batch {st.batch_in_epoch})")
    elif cfg.resume:
        _log(f"--resume: no checkpoint in {work_dir}; starting fresh")

    def progress() -> float:
        p = st.step / total_steps if total_steps else 0.0
        if budget_s:
            p = max(p, st.train_s / budget_s)
        return p

    def save_ckpt():
        if store is not None:
            store.flush()
        _atomic_torch_save({"head": {k: v for k, v in head.state_dict().items() if k != "embed_tokens.weight"},
                            "optimizer": opt.state_dict(), "state": dataclasses.asdict(st),
                            "compat": _ckpt_compat(cfg), "vocab_ids": vocab_ids, "config": dataclasses.asdict(cfg),
                            "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
                                    "python": random.getstate()}}, ckpt_path)

    K = cfg.ttt_steps
    win = {"loss": [], "correct": np.zeros(K), "count": np.zeros(K)}
    last_ckpt_t = time.time()
    stop_reason = "steps"
    bar = tqdm(total=total_steps, initial=st.step, desc="train-draft", disable=not progress_bar, mininterval=1.0,
               dynamic_ncols=True, file=sys.stderr)
    _log(f"{len(train_idx)} train / {len(val_idx)} val sequences, {sum(lengths)} tokens, {per_epoch} batches/epoch, "
         f"steps={total_steps} budget={cfg.time_budget_min} min, device={dev.type}, amp={'bf16' if amp else 'off'}, "
         f"head params={num_params(head)}")
    head.train()
    with _Stop() as stopper:
        while True:
            if progress() >= 1.0:
                stop_reason = "budget" if budget_s and (not total_steps or st.step < total_steps) else "steps"
                break
            if stopper.flag:
                stop_reason = "signal"
                break
            if callback is not None and st.step > 0 and callback(st.step):
                stop_reason = "callback"
                break
            batches = make_batches(lengths, train_idx, cfg, st.epoch)
            if st.batch_in_epoch >= len(batches):
                st.epoch += 1
                st.batch_in_epoch = 0
                continue
            t0 = time.perf_counter()
            idx = batches[st.batch_in_epoch]
            ids, lens, pl, T = _pad_batch(sequences, idx, dev)
            fused, final, am = batch_features(target_model, head.layer_ids, sequences, idx, T, dev, amp, store)
            lr = lr_at(cfg, st.step, progress())
            for gr in opt.param_groups:
                gr["lr"] = lr
            loss, losses, stats = ttt_loss(head, ids, lens, pl, fused, final, am, lm_w_draft, t2draft, K,
                                           cfg.ttt_decay, amp)
            opt.zero_grad(set_to_none=True)
            if loss.requires_grad:
                loss.backward()
                gnorm = float(torch.nn.utils.clip_grad_norm_(trainable, cfg.grad_clip))
                opt.step()
            else:
                gnorm = 0.0
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            st.train_s += time.perf_counter() - t0
            st.step += 1
            st.batch_in_epoch += 1
            st.tokens_seen += int(lens.sum())
            win["loss"].append(float(loss.detach()))
            for i, (c, n) in enumerate(stats):
                win["correct"][i] += c
                win["count"][i] += n
            accs = win["correct"] / np.maximum(win["count"], 1)
            bar.update(1)
            bar.set_postfix_str(f"loss={np.mean(win['loss'][-20:]):.3f} acc=" + "/".join(f"{a:.2f}" for a in accs)
                                + f" lr={lr:.1e}" + (f" t={100 * progress():.0f}%" if budget_s else ""))
            if st.step % cfg.log_every == 0 or st.step == 1:
                point = {"step": st.step, "epoch": st.epoch, "train_s": round(st.train_s, 1), "lr": lr,
                         "loss": float(np.mean(win["loss"])), "acc": [round(float(a), 4) for a in accs],
                         "grad_norm": round(gnorm, 4), "tokens_seen": st.tokens_seen}
                st.curve.append(point)
                _log(f"step {st.step} ep {st.epoch} loss {point['loss']:.4f} acc {point['acc']} lr {lr:.2e} "
                     f"gnorm {gnorm:.3f} train {st.train_s / 60:.1f} min")
                win = {"loss": [], "correct": np.zeros(K), "count": np.zeros(K)}
            if (cfg.checkpoint_every and st.step % cfg.checkpoint_every == 0) or \
                    time.time() - last_ckpt_t > cfg.checkpoint_every_min * 60:
                save_ckpt()
                last_ckpt_t = time.time()
        bar.close()
        save_ckpt()

    # final metrics: the last logging window of training, and the held-out sequences
    if win["loss"]:
        accs = win["correct"] / np.maximum(win["count"], 1)
        st.curve.append({"step": st.step, "epoch": st.epoch, "train_s": round(st.train_s, 1), "lr": lr_at(cfg, st.step, progress()),
                         "loss": float(np.mean(win["loss"])), "acc": [round(float(a), 4) for a in accs],
                         "tokens_seen": st.tokens_seen})
    val = evaluate(head, target_model, sequences, val_idx, cfg, lm_w_draft, t2draft, amp, store) if val_idx else None
    if store is not None:
        store.flush()
    if val:
        _log(f"val loss {val['loss']:.4f} acc {val['acc']}")

    # write the head (bf16 weights, official format) and the manifest
    save_copy = copy.deepcopy(head).to("cpu").to(torch.bfloat16).eval()
    save_copy.cfg = dataclasses.replace(head.cfg, torch_dtype="bfloat16")
    out_dir.mkdir(parents=True, exist_ok=True)
    save_head(save_copy, out_dir)
    del save_copy
    last = st.curve[-1] if st.curve else {}
    manifest = {
        "manifest_version": MANIFEST_VERSION,
        "kind": "eagle3-draft-head",
        "target_model": cfg.model,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "data": {**(data_info or {}), "sequences": len(sequences), "train_sequences": len(train_idx),
                 "val_sequences": len(val_idx), "tokens": int(sum(lengths)),
                 "answer_tokens": int(sum(len(s.ids) - s.prompt_len for s in sequences)), **vocab_stats},
        "sizes": {"draft_vocab_size": int(len(vocab_ids)), "vocab_size": int(vocab_size),
                  "hidden_size": head.cfg.hidden_size, "intermediate_size": head.cfg.intermediate_size,
                  "num_attention_heads": head.cfg.num_attention_heads,
                  "num_key_value_heads": head.cfg.num_key_value_heads,
                  "trainable_params": int(num_params(head)), "target_layer_ids": list(head.layer_ids),
                  "weights_dtype": "bfloat16"},
        "training": {"steps": st.step, "epochs_started": st.epoch + 1, "batches_per_epoch": per_epoch,
                     "tokens_seen": st.tokens_seen, "stop_reason": stop_reason, "train_s": round(st.train_s, 1),
                     "amp": "bf16" if amp else "off", "config": {k: (list(v) if isinstance(v, tuple) else v)
                                                                  for k, v in dataclasses.asdict(cfg).items()}},
        "seed": cfg.seed,
        "device": str(dev),
        "wall_s": round(time.time() - t_start + float((data_info or {}).get("regeneration_s", 0.0)), 1),
        "final_metrics": {"train_loss": last.get("loss"), "train_acc": last.get("acc"),
                          "val_loss": val["loss"] if val else None, "val_acc": val["acc"] if val else None},
        "curve": st.curve,
        "environment": environment_fingerprint(dev),
    }
    _atomic_write_text(out_dir / "manifest.json", json.dumps(manifest, indent=2) + "\n")
    _log(f"wrote {out_dir} ({(out_dir / 'model.safetensors').stat().st_size / 1e6:.1f} MB) after {st.step} steps "
         f"({stop_reason})")
    head.eval()
    manifest["_head"] = head
    return manifest


@torch.no_grad()
def evaluate(head, target_model, sequences, idx_list, cfg: TrainConfig, lm_w_draft, t2draft, amp, store) -> dict:
    """Mean TTT loss and per-step accuracy over `idx_list` (no gradients)."""
    dev = lm_w_draft.device
    K = cfg.ttt_steps
    lsum, lcount = np.zeros(K), np.zeros(K)
    correct, count = np.zeros(K), np.zeros(K)
    lengths = [len(s.ids) for s in sequences]
    for b in make_batches(lengths, idx_list, cfg, 1 << 20):
        ids, lens, pl, T = _pad_batch(sequences, b, dev)
        fused, final, am = batch_features(target_model, head.layer_ids, sequences, b, T, dev, amp, store)
        _, losses, stats = ttt_loss(head, ids, lens, pl, fused, final, am, lm_w_draft, t2draft, K, cfg.ttt_decay, amp)
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


# ------------------------------------------------------------------------------ self-distillation

def parse_dataset_spec(spec) -> list[tuple[str, int | None]]:
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    out = []
    for it in items:
        it = it.strip()
        if not it:
            continue
        name, _, cnt = it.partition(":")
        try:
            out.append((name, int(cnt) if cnt else None))
        except ValueError:
            raise DraftGymError(f"bad dataset spec {it!r}: use NAME or NAME:COUNT") from None
    if not out:
        raise DraftGymError("no dataset given")
    return out


def allocate(n_total: int, sizes: dict[str, int], fixed: dict[str, int]) -> dict[str, int]:
    """Split n_total over datasets: fixed counts first, the rest evenly, capped by what each has
    (water-filling: a small dataset's unused share goes to the others)."""
    alloc = {k: min(v, sizes[k]) for k, v in fixed.items()}
    free = sorted((k for k in sizes if k not in fixed), key=lambda k: sizes[k])
    left = max(0, n_total - sum(alloc.values()))
    for j, k in enumerate(free):                     # smallest first: each takes an even share of what is left
        alloc[k] = min(sizes[k], left // (len(free) - j))
        left -= alloc[k]
    for k in reversed(free):                         # the integer-division remainder
        extra = min(left, sizes[k] - alloc[k])
        alloc[k] += extra
        left -= extra
    return alloc


def select_prompts(cfg: TrainConfig, tokenizer) -> tuple[list[dict], dict]:
    """Train-split prompts, shuffled with the seed, tokenized with the chat template; prompts over
    max_prompt_tokens are skipped. Returns ([{prompt_id, dataset, prompt_ids}], counts)."""
    from pipeline.datasets import load_prompts
    from pipeline.target import encode_prompt

    spec = parse_dataset_spec(cfg.datasets)
    pools = {}
    for name, _ in spec:
        recs = load_prompts(name, split="train")
        order = np.random.default_rng([cfg.seed, int(_hash(name)[:8], 16)]).permutation(len(recs))
        pools[name] = [recs[i] for i in order]
    fixed = {n: c for n, c in spec if c is not None}
    alloc = allocate(cfg.n_prompts, {n: len(p) for n, p in pools.items()}, fixed)
    chosen, counts = [], {}
    for name, recs in pools.items():
        got = 0
        for r in recs:
            if got >= alloc[name]:
                break
            try:
                ids = encode_prompt(tokenizer, list(r.messages), max_prompt_tokens=cfg.max_prompt_tokens)
            except DraftGymError:
                continue
            chosen.append({"prompt_id": r.prompt_id, "dataset": name, "prompt_ids": ids})
            got += 1
        counts[name] = got
    return chosen, counts


def _read_jsonl_tolerant(path: Path) -> dict[str, dict]:
    done = {}
    if not path.is_file():
        return done
    with open(path, "r", encoding="utf-8") as f:
        for line in f:
            try:
                row = json.loads(line)
                done[row["prompt_id"]] = row
            except (json.JSONDecodeError, KeyError):
                continue  # a torn last line from a killed run
    return done


@torch.no_grad()
def regenerate(target, prompts: list[dict], cfg: TrainConfig, path: Path, progress_bar: bool = True) -> list[dict]:
    """Greedy answers from the target for every prompt, appended to JSONL `path` (resumable)."""
    from tqdm import tqdm
    from transformers.utils import logging as hf_logging

    from pipeline.batch_generate import generate_batch
    from pipeline.target import resolve_dtype

    done = _read_jsonl_tolerant(path)
    todo = [p for p in prompts if p["prompt_id"] not in done]
    # length-sorted within random chunks of 8 batches: little padding, and a budget cut drops random prompts
    order = np.random.default_rng(cfg.seed).permutation(len(todo))
    todo = [todo[i] for i in order]
    span = cfg.gen_batch_size * 8
    todo = [p for c in range(0, len(todo), span) for p in sorted(todo[c:c + span], key=lambda p: len(p["prompt_ids"]))]
    if todo and cfg.regen_budget_min is not None and cfg.regen_budget_min <= 0:
        _log(f"regeneration budget 0: training on the {len(done)} cached answers, {len(todo)} prompts skipped")
        todo = []
    if todo:
        _log(f"regenerating {len(todo)} answers ({len(done)} cached) -> {path}")
        dev = target.device
        gdtype = resolve_dtype(cfg.gen_dtype, dev)
        model = target.model
        if next(model.parameters()).dtype != gdtype:
            model = copy.deepcopy(model).to(gdtype)
        if dev.type == "cpu" and hasattr(model, "set_attn_implementation"):
            if model is target.model:
                model = copy.deepcopy(model)
            # one-token decode steps: eager attention is ~2x faster than the CPU flash kernel in bf16
            model.set_attn_implementation("eager")
        eos = sorted(target.eos_token_ids)
        old = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()
        bar = tqdm(total=len(todo), desc="regenerate", disable=not progress_bar, dynamic_ncols=True, file=sys.stderr)
        t0, n_tok, n_done, spent = time.time(), [0], [0], [False]

        def budget_spent() -> bool:      # stops taking prompts from the queue; the rows in flight finish
            if cfg.regen_budget_min is not None and time.time() - t0 >= cfg.regen_budget_min * 60:
                spent[0] = True
            return spent[0]

        try:
            torn = False
            if path.is_file() and path.stat().st_size > 0:
                with open(path, "rb") as f:
                    f.seek(-1, os.SEEK_END)
                    torn = f.read(1) != b"\n"
            with open(path, "a", encoding="utf-8") as f:
                if torn:                            # a killed run left half a line: start on a fresh one
                    f.write("\n")

                def write(i: int, cont) -> None:    # as each row finishes: append, flush (fsync once per batch)
                    p = todo[i]
                    row = {"prompt_id": p["prompt_id"], "dataset": p["dataset"], "prompt_ids": p["prompt_ids"],
                           "response_ids": cont.output_ids, "stop": cont.stop_reason}
                    f.write(json.dumps(row) + "\n")
                    f.flush()
                    done[p["prompt_id"]] = row
                    n_tok[0] += len(cont.output_ids)
                    n_done[0] += 1
                    bar.update(1)
                    if n_done[0] % cfg.gen_batch_size == 0:
                        os.fsync(f.fileno())
                        rate = n_tok[0] / max(time.time() - t0, 1e-9)
                        bar.set_postfix_str(f"{rate:.0f} tok/s")
                        if (n_done[0] // cfg.gen_batch_size) % 5 == 1:
                            _log(f"regenerated {n_done[0]}/{len(todo)} ({n_tok[0]} tokens, {rate:.0f} tok/s)")

                # batched greedy decoding, cut after the first EOS (pipeline/batch_generate.py): a finished
                # row's slot is refilled from the queue at once, so no row waits for the longest answer
                generate_batch(model, [p["prompt_ids"] for p in todo], cfg.max_new_tokens, 0.0, 0, eos,
                               batch_size=cfg.gen_batch_size, on_result=write, stop_refill=budget_spent)
                f.flush()
                os.fsync(f.fileno())
            if spent[0]:
                _log(f"regeneration budget ({cfg.regen_budget_min} min) spent: {len(done)} answers, "
                     f"{len(todo) - n_done[0]} prompts left for a later run")
        finally:
            hf_logging.set_verbosity(old)
            bar.close()
        del model
    return [done[p["prompt_id"]] for p in prompts if p["prompt_id"] in done]


# ------------------------------------------------------------------------------ CLI entry

def default_work_dir(model: str) -> Path:
    from pipeline.target import cache_dir
    return cache_dir() / "train-draft" / _slug(model)


def select_reference_sequences(cfg: TrainConfig, tokenizer, exclude: set[str], eos_id: int | None) -> list[TrainSequence]:
    """`reference_prompts` train-split prompts (not in `exclude`) with their dataset reference answer
    as the answer text: cheap extra data (no generation; only the teacher-forced target forward),
    labelled, like everything else, with the target's own distributions (EAGLE's original recipe).
    Answers are cut at max_new_tokens (an uncut answer ends with eos)."""
    from pipeline.datasets import load_prompts
    from pipeline.target import encode_prompt

    names = [n for n in cfg.reference_datasets if n]
    pools = []
    for name in names:
        recs = [r for r in load_prompts(name, split="train") if r.reference and r.prompt_id not in exclude]
        order = np.random.default_rng([cfg.seed, 7, int(_hash(name)[:8], 16)]).permutation(len(recs))
        pools.append([recs[i] for i in order])
    want = allocate(cfg.reference_prompts, {n: len(p) for n, p in zip(names, pools)}, {})
    out = []
    for name, recs in zip(names, pools):
        got = 0
        for r in recs:
            if got >= want[name]:
                break
            try:
                p_ids = encode_prompt(tokenizer, list(r.messages), max_prompt_tokens=cfg.max_prompt_tokens)
            except DraftGymError:
                continue
            a_ids = tokenizer(r.reference.strip(), add_special_tokens=False)["input_ids"]
            if not a_ids:
                continue
            a_ids = a_ids[: cfg.max_new_tokens] if len(a_ids) >= cfg.max_new_tokens or eos_id is None \
                else a_ids + [eos_id]
            out.append(TrainSequence(p_ids + a_ids, len(p_ids), "ref:" + r.prompt_id))
            got += 1
    return out


def run_train_draft(cfg: TrainConfig, progress_bar: bool = True) -> dict:
    """The whole command: load the target, regenerate answers, train, save."""
    from pipeline.target import load_target

    cfg.validate()
    t0 = time.time()
    target = load_target(cfg.model, device=cfg.device, dtype=cfg.dtype)
    work = Path(cfg.work_dir) if cfg.work_dir else default_work_dir(cfg.model)
    work.mkdir(parents=True, exist_ok=True)
    prompts, counts = select_prompts(cfg, target.tokenizer)
    if not prompts:
        raise DraftGymError("no train-split prompts fit --max-prompt-tokens")
    gkey = _hash({"model": cfg.model, "max_new_tokens": cfg.max_new_tokens, "gen_dtype": cfg.gen_dtype, "v": 1})
    rows = regenerate(target, prompts, cfg, work / f"responses-{gkey}.jsonl", progress_bar)
    regen_s = time.time() - t0
    seqs = [TrainSequence(r["prompt_ids"] + r["response_ids"], len(r["prompt_ids"]), r["prompt_id"]) for r in rows]
    done_counts = dict(Counter(r["dataset"] for r in rows))
    info = {"datasets": done_counts, "n_prompts": len(rows), "n_prompts_selected": counts, "split": "train",
            "self_distillation": {"greedy": True, "max_new_tokens": cfg.max_new_tokens, "gen_dtype": cfg.gen_dtype,
                                  "answers": len(rows), "answer_tokens": sum(len(r["response_ids"]) for r in rows),
                                  "stopped_at_eos": sum(r["stop"] == "eos" for r in rows)},
            "regeneration_s": round(regen_s, 1)}
    if cfg.reference_prompts > 0:
        eos = sorted(target.eos_token_ids)
        refs = select_reference_sequences(cfg, target.tokenizer, {p["prompt_id"] for p in prompts},
                                          eos[0] if eos else None)
        seqs += refs
        info["reference_answers"] = {"datasets": dict(Counter(s.source.split(":", 1)[1].split("/")[0] for s in refs)),
                                     "sequences": len(refs),
                                     "answer_tokens": sum(len(s.ids) - s.prompt_len for s in refs)}
    run_dir = work / f"run-{_hash(_ckpt_compat(cfg) | {'data': _hash([s.source for s in seqs])})}"
    _log(f"{len(seqs)} sequences ({len(rows)} regenerated: {done_counts}; "
         f"{len(seqs) - len(rows)} with reference answers); run dir {run_dir}")
    manifest = train_head(cfg, target.model, seqs, cfg.out, run_dir, info, progress_bar)
    manifest.pop("_head", None)
    return manifest


def config_from_args(args) -> TrainConfig:
    """argparse namespace -> TrainConfig (flags left at None keep the dataclass defaults)."""
    cfg = TrainConfig()
    for f in dataclasses.fields(TrainConfig):
        v = getattr(args, f.name, None)
        if v is not None:
            setattr(cfg, f.name, v)
    cfg.datasets = tuple(x.strip() for x in args.dataset.split(",") if x.strip())
    if getattr(args, "no_feature_cache", False):
        cfg.feature_cache = False
    if getattr(args, "no_init_from_target", False):
        cfg.init_lm_head_from_target = False
    return cfg


def run_train_draft_command(args) -> int:
    cfg = config_from_args(args)
    manifest = run_train_draft(cfg, progress_bar=not args.no_progress)
    fm = manifest["final_metrics"]
    print(json.dumps({"out": str(cfg.out), "steps": manifest["training"]["steps"], **fm}))
    return 0
