"""`draftgym train-draft`: train an EAGLE-3 draft head for a target (self-distillation + TTT).

Pipeline (SpecForge-style; CleanRL-style hyperparameters in `TrainConfig`, pipeline/train_config.py).
One module per stage: data and self-distillation (pipeline/distill_data.py), features
(pipeline/train_features.py), head initialisation (pipeline/train_init.py), the TTT step
(pipeline/ttt.py), and the training loop and command here:

  1. Self-distillation. The target regenerates greedy answers to the train-split prompts (batched,
     `pipeline.batch_generate`: slots refilled from the queue). Answers are appended to a JSONL cache
     per generation setting, so a killed run resumes where it stopped. Before training, the
     sequences are frozen into one Parquet of token ids (`dataset-<hash>.parquet` in the work dir,
     its sha256 in the manifest); `--data` trains on such a file without any regeneration.
  1b. Initialisation (`--init`, default passthrough: lm_head and norm from the target, fc passing
     the highest fused layer through, attention and MLP outputs zero), then the lm_head scaled by
     the factor that gives the lowest TTT loss on the first batch, so the first cross-entropy is
     at or below ln(draft vocab) (train_init.calibrate_logit_scale).
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
     can still reach a response token. The soft labels are computed once per batch and the
     lm_head runs only on labelled rows. `--ttt-curriculum 4@0,7@0.5` trains 4 steps, then 7.
  5. AdamW (0.9, 0.95), linear warm-up then cosine decay, grad-norm clip 0.5. The schedule runs on
     `progress` = max(step / steps, train-time / time budget), so a time-budgeted run decays fully
     by its deadline; the time budget is the run's total over all its sessions (`--session-budget-min`
     ends one session without touching the schedule). Checkpoints (head + optimizer + step + data
     position + elapsed time + RNG + data hash) are written atomically every `checkpoint_every` steps /
     `checkpoint_every_min` minutes and at the end, in one run directory per `--out`; `--resume`
     continues bit-exactly, and refuses in one line when the data or a setting changed, as a new
     run refuses to overwrite a checkpoint without `--restart`.
  6. Output: the official head format via `save_head` (config.json + model.safetensors, weights
     stored as bfloat16) and `manifest.json` (data with the frozen dataset's sha256, sizes, the
     initialisation, steps, sessions (wall time, CPU model), curve, final metrics, environment).

`train_head` is the core and takes pre-tokenized sequences, so tests need no tokenizer.
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
import random
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from pipeline.distill_data import (DATASET_SCHEMA_VERSION, TrainSequence, allocate, default_work_dir,  # noqa: F401
                                   freeze_sequences, load_frozen, parse_dataset_spec, regenerate, select_prompts,
                                   select_reference_sequences)
from pipeline.errors import DraftGymError
from pipeline.head import num_params, resolve_head_dir, save_head
from pipeline.head_lineage import CURVE_PNG, lineage_of, plot_lineage
from pipeline.train_config import (INITS, MANIFEST_VERSION, TrainConfig, _atomic_torch_save,  # noqa: F401
                                   _atomic_write_text, _hash, _log, _slug, lr_at, parse_curriculum, resolve_amp,
                                   ttt_steps_at)
from pipeline.train_features import FeatureStore, batch_features, target_features  # noqa: F401
from pipeline.train_init import (LOGIT_SCALES, build_draft_vocab, build_head,  # noqa: F401
                                 calibrate_logit_scale, set_draft_vocab)
from pipeline.ttt import ttt_loss, ttt_mask  # noqa: F401


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


@dataclass
class _State:
    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    train_s: float = 0.0
    tokens_seen: int = 0
    curve: list = field(default_factory=list)
    sessions: list = field(default_factory=list)    # one entry per session: when, where, steps, training time
    heldout_curve: list = field(default_factory=list)   # {step, train_s, loss, acc} on the fixed held-out set
    init: dict = field(default_factory=dict)        # calibrate_logit_scale's choice and what it measured


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


def _ckpt_compat(cfg: TrainConfig) -> dict:
    """Fields a checkpoint must agree on to be resumed."""
    keys = ("model", "dtype", "draft_vocab_size", "intermediate_size", "ttt_steps", "max_len", "seed", "batch_size",
            "batch_tokens", "init", "init_from")
    return {k: getattr(cfg, k) for k in keys}


def _trainable(seqs: list[TrainSequence], max_len: int) -> list[TrainSequence]:
    """The sequences cut to max_len tokens that still hold an answer token (at least 2 tokens)."""
    seqs = [s for s in seqs if len(s.ids) >= 2 and s.prompt_len < len(s.ids)]
    seqs = [TrainSequence(s.ids[:max_len], min(s.prompt_len, max_len), s.source) for s in seqs]
    return [s for s in seqs if s.prompt_len < len(s.ids)]


def _gen_key(cfg: TrainConfig) -> str:
    """The answers' generation setting: the JSONL caches of the training and held-out answers are keyed by it."""
    return _hash({"model": cfg.model, "max_new_tokens": cfg.max_new_tokens, "gen_dtype": cfg.gen_dtype, "v": 1})


def train_head(cfg: TrainConfig, target_model, sequences: list[TrainSequence], out_dir: str | Path,
               work_dir: str | Path, data_info: dict | None = None, progress_bar: bool = True,
               callback=None, heldout: list[TrainSequence] | None = None) -> dict:
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
    sequences = _trainable(sequences, cfg.max_len)
    if not sequences:
        raise DraftGymError("no training sequences with an answer")
    lengths = [len(s.ids) for s in sequences]
    rng = np.random.default_rng(cfg.seed)
    perm = rng.permutation(len(sequences)).tolist()
    n_val = min(cfg.max_val_sequences, int(len(sequences) * cfg.val_fraction)) if len(sequences) >= 20 else 0
    val_idx, train_idx = sorted(perm[:n_val]), sorted(perm[n_val:])
    vocab_size = target_model.get_input_embeddings().weight.shape[0]
    vocab_ids, vocab_stats = build_draft_vocab([sequences[i] for i in train_idx], cfg.draft_vocab_size, vocab_size)
    warm = None
    if cfg.init_from:   # warm start: the head's weights and its own draft vocabulary
        from pipeline.head import load_head
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
        del warm
    trainable = [p for n, p in head.named_parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay)
    lm_w_draft = target_model.get_output_embeddings().weight[vocab_ids.to(dev)].float().detach()
    t2draft = torch.full((vocab_size,), -1, dtype=torch.long, device=dev)
    t2draft[vocab_ids.to(dev)] = torch.arange(len(vocab_ids), device=dev)

    data_hash = _hash([s.ids for s in sequences])
    store = None
    if cfg.feature_cache:
        fkey = _hash({"model": cfg.model, "seqs": data_hash, "layers": head.layer_ids,
                      "amp": amp, "dtype": str(next(target_model.parameters()).dtype), "v": 1})
        H_t = target_model.config.hidden_size
        store = FeatureStore(work_dir / f"features-{fkey}", lengths, 3 * H_t, H_t)

    per_epoch = len(make_batches(lengths, train_idx, cfg, 0))
    budget_s = cfg.time_budget_min * 60 if cfg.time_budget_min else None
    epochs = cfg.epochs if cfg.epochs is not None else (None if budget_s else 1.0)
    total_steps = cfg.steps if cfg.steps is not None else (max(1, int(round(epochs * per_epoch))) if epochs else None)

    st = _State()
    ckpt_path = work_dir / "checkpoint.pt"
    if not cfg.resume and not cfg.restart and ckpt_path.is_file():
        raise DraftGymError(f"{ckpt_path} holds a run of this --out: pass --resume to continue it or --restart "
                            "to start over")
    if cfg.resume and not ckpt_path.is_file():
        raise DraftGymError(f"--resume: no checkpoint in {work_dir} (drop --resume to start a new run)")
    if cfg.resume:
        ck = torch.load(ckpt_path, map_location="cpu", weights_only=False)
        if ck.get("compat") != _ckpt_compat(cfg):
            theirs = ck.get("compat") or {}
            diff = ", ".join(f"{k} {theirs.get(k)!r} -> {v!r}" for k, v in _ckpt_compat(cfg).items() if theirs.get(k) != v)
            raise DraftGymError(f"--resume: checkpoint {ckpt_path} was made with other settings ({diff}); "
                                "use the same settings, or --restart")
        if ck.get("data_hash") not in (None, data_hash):
            raise DraftGymError(f"--resume: checkpoint {ckpt_path} was trained on other data ({ck.get('n_sequences')} "
                                f"sequences, hash {ck['data_hash']}; now {len(sequences)}, hash {data_hash}); "
                                "freeze the dataset the run started with, or --restart")
        if not torch.equal(ck["vocab_ids"], vocab_ids):
            raise DraftGymError(f"--resume: checkpoint {ckpt_path} has another draft vocabulary (other data?)")
        head.load_state_dict(ck["head"], strict=False)
        opt.load_state_dict(ck["optimizer"])
        st = _State(**ck["state"])
        torch.set_rng_state(ck["rng"]["torch"])
        np.random.set_state(ck["rng"]["numpy"])
        random.setstate(ck["rng"]["python"])
        _log(f"resumed from {ckpt_path} at step {st.step} (epoch {st.epoch}, batch {st.batch_in_epoch})")

    if cfg.init_from and st.step == 0:
        # the parent's history travels with the head (pipeline/head_lineage.py): kept in the
        # checkpointed state, so a resumed run still has it when the parent directory is gone
        st.init = {"init": "from", "from": str(cfg.init_from),
                   "lineage": lineage_of(resolve_head_dir(cfg.init_from), str(cfg.init_from))}
    elif st.step == 0 and cfg.init != "random":   # a fresh head: temper its logits on the first batch
        b0 = make_batches(lengths, train_idx, cfg, 0)[0]
        ids, lens, pl, T = _pad_batch(sequences, b0, dev)
        feats = batch_features(target_model, head.layer_ids, sequences, b0, T, dev, amp, store)
        st.init = {"init": cfg.init, **calibrate_logit_scale(head, (ids, lens, pl, *feats, lm_w_draft, t2draft),
                                                             cfg.ttt_steps, cfg.ttt_decay, amp)}
        _log(f"init {cfg.init}: logit scale {st.init['logit_scale']} (cross-entropy per TTT step "
             f"{st.init['ce_per_step']} against ln(draft vocab) = {math.log(len(vocab_ids)):.3f})")

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
                            "data_hash": data_hash, "n_sequences": len(sequences),
                            "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
                                    "python": random.getstate()}}, ckpt_path)

    # the fixed on-policy held-out set (val-split prompts, the target's own answers): its accuracy curve
    heldout = _trainable(heldout or [], cfg.max_len)
    ho_hash = _hash([s.ids for s in heldout]) if heldout else None
    ho_store = None
    if heldout and cfg.feature_cache:
        H_t = target_model.config.hidden_size
        ho_store = FeatureStore(work_dir / f"features-heldout-{ho_hash}",
                                [len(s.ids) for s in heldout], 3 * H_t, H_t)

    def eval_heldout() -> None:
        if not heldout or (st.heldout_curve and st.heldout_curve[-1]["step"] == st.step):
            return
        r = evaluate(head, target_model, heldout, list(range(len(heldout))), cfg, lm_w_draft, t2draft, amp, ho_store)
        st.heldout_curve.append({"step": st.step, "train_s": round(st.train_s, 1), "loss": round(r["loss"], 4),
                                 "acc": r["acc"], "positions": r["positions"][0]})
        _log(f"held-out ({len(heldout)} sequences) at step {st.step}: loss {r['loss']:.4f} acc {r['acc']}")

    eval_heldout()
    K = cfg.ttt_steps
    curriculum = parse_curriculum(cfg.ttt_curriculum, K)
    session_t0 = time.time()
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
            if cfg.session_budget_min and time.time() - session_t0 >= cfg.session_budget_min * 60:
                stop_reason = "session"
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
            k_now = ttt_steps_at(curriculum, K, progress())
            loss, losses, stats = ttt_loss(head, ids, lens, pl, fused, final, am, lm_w_draft, t2draft, k_now,
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
                point = {"step": st.step, "epoch": st.epoch, "train_s": round(st.train_s, 1), "lr": lr, "ttt_steps": k_now,
                         "loss": float(np.mean(win["loss"])), "acc": [round(float(a), 4) for a in accs],
                         "grad_norm": round(gnorm, 4), "tokens_seen": st.tokens_seen}
                st.curve.append(point)
                _log(f"step {st.step} ep {st.epoch} loss {point['loss']:.4f} acc {point['acc']} lr {lr:.2e} "
                     f"gnorm {gnorm:.3f} train {st.train_s / 60:.1f} min")
                win = {"loss": [], "correct": np.zeros(K), "count": np.zeros(K)}
            if cfg.eval_every and st.step % cfg.eval_every == 0:
                eval_heldout()
            if (cfg.checkpoint_every and st.step % cfg.checkpoint_every == 0) or \
                    time.time() - last_ckpt_t > cfg.checkpoint_every_min * 60:
                save_ckpt()
                last_ckpt_t = time.time()
        bar.close()
        eval_heldout()
        from pipeline.fingerprint import cpu_model
        st.sessions.append({"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(session_t0)),
                            "wall_s": round(time.time() - session_t0, 1), "steps_to": st.step,
                            "train_s_to": round(st.train_s, 1), "stop_reason": stop_reason,
                            "device": str(dev), "cpu_model": cpu_model()})
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
                     "sessions": st.sessions,
                     "tokens_seen": st.tokens_seen, "stop_reason": stop_reason, "train_s": round(st.train_s, 1),
                     "amp": "bf16" if amp else "off", "config": {k: (list(v) if isinstance(v, tuple) else v)
                                                                  for k, v in dataclasses.asdict(cfg).items()}},
        "init": {k: v for k, v in st.init.items() if k != "lineage"},
        "lineage": st.init.get("lineage", []),
        "seed": cfg.seed,
        "device": str(dev),
        "wall_s": round(time.time() - t_start + float((data_info or {}).get("regeneration_s", 0.0)), 1),
        "final_metrics": {"train_loss": last.get("loss"), "train_acc": last.get("acc"),
                          "val_loss": val["loss"] if val else None, "val_acc": val["acc"] if val else None},
        "curve": st.curve,
        "heldout": {"sequences": len(heldout), "data_hash": ho_hash,
                    "curve": st.heldout_curve},
        "environment": environment_fingerprint(dev),
    }
    _atomic_write_text(out_dir / "manifest.json", json.dumps(manifest, indent=2) + "\n")
    if st.heldout_curve:
        plot_lineage(manifest, out_dir / CURVE_PNG, str(out_dir))
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


def run_train_draft(cfg: TrainConfig, progress_bar: bool = True) -> dict:
    """The whole command: load the target, regenerate answers (or read a frozen dataset), freeze the
    data, train, save."""
    from pipeline.target import load_target

    cfg.validate()
    t0 = time.time()
    # inputs first: a wrong --init-from or --data fails in one line before any model loads or answer is generated
    if cfg.init_from:
        resolve_head_dir(cfg.init_from)
    frozen_data = load_frozen(cfg.data) if cfg.data else None
    target = load_target(cfg.model, device=cfg.device, dtype=cfg.dtype)
    work = Path(cfg.work_dir) if cfg.work_dir else default_work_dir(cfg.model)
    work.mkdir(parents=True, exist_ok=True)
    if frozen_data is not None:
        seqs, info = frozen_data
        info = {**info, "frozen": {"path": str(cfg.data), "sha256": hashlib.sha256(Path(cfg.data).read_bytes()).hexdigest()}}
        _log(f"{len(seqs)} sequences from the frozen dataset {cfg.data}")
        return _train_frozen(cfg, target, seqs, info, work, progress_bar)
    prompts, counts = select_prompts(cfg, target.tokenizer)
    if not prompts:
        raise DraftGymError("no train-split prompts fit --max-prompt-tokens")
    rows = regenerate(target, prompts, cfg, work / f"responses-{_gen_key(cfg)}.jsonl", progress_bar)
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
    frozen = freeze_sequences(seqs, work / f"dataset-{_hash([s.ids for s in seqs])[:12]}.parquet", info)
    info = {**info, "frozen": {k: frozen[k] for k in ("path", "sha256")}}
    _log(f"froze {frozen['sequences']} sequences ({frozen['tokens']} tokens) into {frozen['path']}")
    return _train_frozen(cfg, target, seqs, info, work, progress_bar)


def _train_frozen(cfg: TrainConfig, target, seqs: list[TrainSequence], info: dict, work: Path, progress_bar: bool) -> dict:
    # one run directory per --out: a changed dataset or setting meets its checkpoint and is refused with
    # one line (train_head), instead of silently starting over in a fresh directory
    run_dir = work / f"run-{_slug(Path(cfg.out).name)}-{_hash(str(Path(cfg.out).resolve()))[:8]}"
    _log(f"{len(seqs)} sequences; run dir {run_dir}")
    heldout = []
    if cfg.heldout_prompts > 0:   # val-split prompts, the target's own answers (complete, whatever the regen budget)
        hp, _ = select_prompts(cfg, target.tokenizer, split="val", n_total=cfg.heldout_prompts)
        rows = regenerate(target, hp, dataclasses.replace(cfg, regen_budget_min=None),
                          work / f"heldout-{_gen_key(cfg)}.jsonl", progress_bar)
        heldout = [TrainSequence(r["prompt_ids"] + r["response_ids"], len(r["prompt_ids"]), r["prompt_id"]) for r in rows]
    manifest = train_head(cfg, target.model, seqs, cfg.out, run_dir, info, progress_bar, heldout=heldout)
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
    if getattr(args, "ttt_curriculum", None):
        cfg.ttt_curriculum = tuple(x.strip() for x in args.ttt_curriculum.split(",") if x.strip())
    if getattr(args, "no_feature_cache", False):
        cfg.feature_cache = False
    if getattr(args, "no_init_from_target", False):
        cfg.init = "random"
    return cfg


def run_train_draft_command(args) -> int:
    cfg = config_from_args(args)
    manifest = run_train_draft(cfg, progress_bar=not args.no_progress)
    fm = manifest["final_metrics"]
    print(json.dumps({"out": str(cfg.out), "steps": manifest["training"]["steps"], **fm}))
    return 0
