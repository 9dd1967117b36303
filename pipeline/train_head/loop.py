"""The head-training loop, `train_head`: one session of a run as a sequence of named steps.

    run = prepare_run(...)              data split, draft vocabulary, head, optimizer, feature caches
    st = _resume_or_start(run)          the checkpoint's state (--resume), or step 0 with the init
    _evaluate_heldout(run, st)          the held-out curve's first point
    _train_session(run, st, ...)        _train_step until _why_stop; curve points, held-out
                                        evaluations and checkpoints on their schedules
    ttt_metrics(... val ...)            the final validation metrics
    _save_head_bf16, _manifest          the head (official format) and manifest.json

`TrainRun` (pipeline/train_head/run.py) holds what a session works with and is rebuilt from the same
inputs on --resume; `TrainState` (pipeline/train_head/checkpoint.py) is what changes while it trains
and is checkpointed. The maths of one step (the TTT loss) is in pipeline/train_head/ttt.py; the
command around the loop (data, regeneration, freezing) in pipeline/train_head/train.py.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import math
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from pipeline.models.head import num_params, resolve_head_dir, save_head
from pipeline.runtime.atomic import atomic_write_text
from pipeline.train_head.batches import make_batches, pad_batch
from pipeline.train_head.checkpoint import TrainState, check_start, load_checkpoint, save_checkpoint
from pipeline.train_head.config import MANIFEST_VERSION, TrainConfig, _log, lr_at, ttt_steps_at
from pipeline.train_head.data import TrainSequence
from pipeline.train_head.features import batch_features
from pipeline.train_head.initialise import calibrate_logit_scale
from pipeline.train_head.lineage import CURVE_PNG, lineage_of, plot_lineage
from pipeline.train_head.run import TrainRun, prepare_run
from pipeline.train_head.ttt import ttt_loss, ttt_metrics


# -- the loop ---------------------------------------------------------------------------------------

def train_head(cfg: TrainConfig, target_model, sequences: list[TrainSequence], out_dir: str | Path,
               work_dir: str | Path, data_info: dict | None = None, progress_bar: bool = True,
               callback=None, heldout: list[TrainSequence] | None = None) -> dict:
    """Train an EAGLE-3 head on pre-tokenized sequences; write the head + manifest to out_dir.

    Checkpoints and the feature cache live in work_dir. `callback(step)` is called after every
    optimizer step; returning True stops the run as an interruption would (checkpoint + head).
    `heldout`: the fixed on-policy held-out set (val-split prompts, the target's own answers) whose
    loss and accuracy curve is recorded. Returns the manifest dict (plus the trained fp32 head under "_head")."""
    t_start = time.time()
    out_dir, work_dir = Path(out_dir), Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    run = prepare_run(cfg, target_model, sequences, work_dir, heldout or [])
    st = _resume_or_start(run)
    _evaluate_heldout(run, st)
    stop_reason, win = _train_session(run, st, progress_bar, callback)

    # final metrics: the last logging window of training, and the validation sequences
    if win.loss:
        st.curve.append(win.point(st, lr_at(cfg, st.step, run.progress(st))))
    val = ttt_metrics(run.head, target_model, run.sequences, run.val_idx, cfg, run.lm_w_draft, run.t2draft, run.amp,
                      run.store) if run.val_idx else None
    if run.store is not None:
        run.store.flush()
    if val:
        _log(f"val loss {val['loss']:.4f} acc {val['acc']}")

    _save_head_bf16(run.head, out_dir)
    manifest = _manifest(run, st, stop_reason, val, data_info, t_start)
    atomic_write_text(out_dir / "manifest.json", json.dumps(manifest, indent=2) + "\n")
    if st.heldout_curve:
        plot_lineage(manifest, out_dir / CURVE_PNG, str(out_dir))
    _log(f"wrote {out_dir} ({(out_dir / 'model.safetensors').stat().st_size / 1e6:.1f} MB) after {st.step} steps "
         f"({stop_reason})")
    run.head.eval()
    manifest["_head"] = run.head
    return manifest


# -- the steps of a session ---------------------------------------------------------------------------

def _resume_or_start(run: TrainRun) -> TrainState:
    """--resume: the checkpoint's state (weights, optimizer, RNGs restored). A new run: step 0, with
    the parent's lineage (--init-from) or the logit scale calibrated on the first batch (--init)."""
    cfg = run.cfg
    check_start(run.ckpt_path, cfg)
    st = TrainState()
    if cfg.resume:
        st = load_checkpoint(run.ckpt_path, cfg, run.head, run.opt, run.vocab_ids, run.data_hash, len(run.sequences))
    if cfg.init_from and st.step == 0:
        # the parent's history travels with the head (pipeline/train_head/lineage.py): kept in the
        # checkpointed state, so a resumed run still has it when the parent directory is gone
        st.init = {"init": "from", "from": str(cfg.init_from),
                   "lineage": lineage_of(resolve_head_dir(cfg.init_from), str(cfg.init_from))}
    elif st.step == 0 and cfg.init != "random":   # a fresh head: temper its logits on the first batch
        b0 = make_batches(run.lengths, run.train_idx, cfg, 0)[0]
        ids, lens, pl, T = pad_batch(run.sequences, b0, run.dev)
        feats = batch_features(run.target_model, run.head.layer_ids, run.sequences, b0, T, run.dev, run.amp, run.store)
        st.init = {"init": cfg.init, **calibrate_logit_scale(
            run.head, (ids, lens, pl, *feats, run.lm_w_draft, run.t2draft), cfg.ttt_steps, cfg.ttt_decay, run.amp,
            target_config=run.target_model.config)}
        _log(f"init {cfg.init}: logit scale {st.init['logit_scale']} (cross-entropy per TTT step "
             f"{st.init['ce_per_step']} against ln(draft vocab) = {math.log(len(run.vocab_ids)):.3f})")
    return st


class _Stop:
    """SIGTERM / SIGINT -> finish the current step, checkpoint, save the head, exit."""

    def __init__(self):
        self.flag = False
        self._old = {}

    def __enter__(self):
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


def _why_stop(run: TrainRun, st: TrainState, stopper: _Stop, session_t0: float, callback) -> str | None:
    """Why the session ends before the next step (None: it goes on)."""
    cfg = run.cfg
    if run.progress(st) >= 1.0:
        return "budget" if run.budget_s and (not run.total_steps or st.step < run.total_steps) else "steps"
    if stopper.flag:
        return "signal"
    if cfg.session_budget_min and time.time() - session_t0 >= cfg.session_budget_min * 60:
        return "session"
    if callback is not None and st.step > 0 and callback(st.step):
        return "callback"
    return None


@dataclass
class _Step:
    """What one optimizer step reports."""
    loss: float
    stats: list            # [(correct, count)] per TTT step
    grad_norm: float
    lr: float
    ttt_steps: int


def _train_step(run: TrainRun, st: TrainState, idx: list[int]) -> _Step:
    """One optimizer step on the batch `idx`: features, the TTT loss (pipeline/train_head/ttt.py) at the
    schedule's learning rate and TTT steps, backward, clip, AdamW. Advances `st`."""
    cfg = run.cfg
    t0 = time.perf_counter()
    ids, lens, pl, T = pad_batch(run.sequences, idx, run.dev)
    fused, final, am = batch_features(run.target_model, run.head.layer_ids, run.sequences, idx, T, run.dev,
                                      run.amp, run.store)
    lr = lr_at(cfg, st.step, run.progress(st))
    for gr in run.opt.param_groups:
        gr["lr"] = lr
    k_now = ttt_steps_at(run.curriculum, cfg.ttt_steps, run.progress(st))
    loss, _, stats = ttt_loss(run.head, ids, lens, pl, fused, final, am, run.lm_w_draft, run.t2draft, k_now,
                              cfg.ttt_decay, run.amp, target_config=run.target_model.config)
    run.opt.zero_grad(set_to_none=True)
    gnorm = 0.0
    if loss.requires_grad:
        loss.backward()
        gnorm = float(torch.nn.utils.clip_grad_norm_(run.trainable, cfg.grad_clip))
        run.opt.step()
    if run.dev.type == "cuda":
        torch.cuda.synchronize(run.dev)
    st.train_s += time.perf_counter() - t0
    st.step += 1
    st.batch_in_epoch += 1
    st.tokens_seen += int(lens.sum())
    return _Step(float(loss.detach()), stats, gnorm, lr, k_now)


class _Window:
    """Loss and per-TTT-step accuracy since the last curve point."""

    def __init__(self, K: int):
        self.loss: list[float] = []
        self.correct, self.count = np.zeros(K), np.zeros(K)

    def add(self, s: _Step) -> None:
        self.loss.append(s.loss)
        for i, (c, n) in enumerate(s.stats):
            self.correct[i] += c
            self.count[i] += n

    def accs(self) -> np.ndarray:
        return self.correct / np.maximum(self.count, 1)

    def point(self, st: TrainState, lr: float, ttt_steps: int | None = None, grad_norm: float | None = None) -> dict:
        """A curve point: where the run is, the window's mean loss and accuracies (and the last step's
        TTT steps and gradient norm, when given)."""
        p = {"step": st.step, "epoch": st.epoch, "train_s": round(st.train_s, 1), "lr": lr}
        if ttt_steps is not None:
            p["ttt_steps"] = ttt_steps
        p |= {"loss": float(np.mean(self.loss)), "acc": [round(float(a), 4) for a in self.accs()]}
        if grad_norm is not None:
            p["grad_norm"] = round(grad_norm, 4)
        return p | {"tokens_seen": st.tokens_seen}


def _evaluate_heldout(run: TrainRun, st: TrainState) -> None:
    """Add the held-out loss and accuracy at this step to the held-out curve (once per step)."""
    if not run.heldout or (st.heldout_curve and st.heldout_curve[-1]["step"] == st.step):
        return
    r = ttt_metrics(run.head, run.target_model, run.heldout, list(range(len(run.heldout))), run.cfg, run.lm_w_draft,
                    run.t2draft, run.amp, run.heldout_store)
    st.heldout_curve.append({"step": st.step, "train_s": round(st.train_s, 1), "loss": round(r["loss"], 4),
                             "acc": r["acc"], "positions": r["positions"][0]})
    _log(f"held-out ({len(run.heldout)} sequences) at step {st.step}: loss {r['loss']:.4f} acc {r['acc']}")


def _save_checkpoint(run: TrainRun, st: TrainState) -> None:
    if run.store is not None:
        run.store.flush()
    save_checkpoint(run.ckpt_path, st, run.cfg, run.head, run.opt, run.vocab_ids, run.data_hash, len(run.sequences))


def _train_session(run: TrainRun, st: TrainState, progress_bar: bool, callback) -> tuple[str, _Window]:
    """Train until the step or time budget, the session budget, a signal or `callback` ends the session;
    log curve points, evaluate the held-out set and checkpoint on their schedules, and once at the end.
    Returns (stop reason, the logging window not yet on the curve)."""
    from tqdm import tqdm

    from pipeline.runtime.fingerprint import cpu_model

    cfg = run.cfg
    session_t0 = last_ckpt_t = time.time()
    win = _Window(cfg.ttt_steps)
    bar = tqdm(total=run.total_steps, initial=st.step, desc="train-draft", disable=not progress_bar, mininterval=1.0,
               dynamic_ncols=True, file=sys.stderr)
    _log(f"{len(run.train_idx)} train / {len(run.val_idx)} val sequences, {sum(run.lengths)} tokens, "
         f"{run.per_epoch} batches/epoch, steps={run.total_steps} budget={cfg.time_budget_min} min, "
         f"device={run.dev.type}, amp={'bf16' if run.amp else 'off'}, head params={num_params(run.head)}")
    run.head.train()
    with _Stop() as stopper:
        while (stop_reason := _why_stop(run, st, stopper, session_t0, callback)) is None:
            batches = make_batches(run.lengths, run.train_idx, cfg, st.epoch)
            if st.batch_in_epoch >= len(batches):
                st.epoch += 1
                st.batch_in_epoch = 0
                continue
            s = _train_step(run, st, batches[st.batch_in_epoch])
            win.add(s)
            bar.update(1)
            bar.set_postfix_str(f"loss={np.mean(win.loss[-20:]):.3f} acc=" + "/".join(f"{a:.2f}" for a in win.accs())
                                + f" lr={s.lr:.1e}" + (f" t={100 * run.progress(st):.0f}%" if run.budget_s else ""))
            if st.step % cfg.log_every == 0 or st.step == 1:
                point = win.point(st, s.lr, s.ttt_steps, s.grad_norm)
                st.curve.append(point)
                _log(f"step {st.step} ep {st.epoch} loss {point['loss']:.4f} acc {point['acc']} lr {s.lr:.2e} "
                     f"gnorm {s.grad_norm:.3f} train {st.train_s / 60:.1f} min")
                win = _Window(cfg.ttt_steps)
            if cfg.eval_every and st.step % cfg.eval_every == 0:
                _evaluate_heldout(run, st)
            if (cfg.checkpoint_every and st.step % cfg.checkpoint_every == 0) or \
                    time.time() - last_ckpt_t > cfg.checkpoint_every_min * 60:
                _save_checkpoint(run, st)
                last_ckpt_t = time.time()
        bar.close()
        _evaluate_heldout(run, st)
        st.sessions.append({"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(session_t0)),
                            "wall_s": round(time.time() - session_t0, 1), "steps_to": st.step,
                            "train_s_to": round(st.train_s, 1), "stop_reason": stop_reason,
                            "device": str(run.dev), "cpu_model": cpu_model()})
        _save_checkpoint(run, st)
    return stop_reason, win


def _manifest(run: TrainRun, st: TrainState, stop_reason: str, val: dict | None, data_info: dict | None,
              t_start: float) -> dict:
    """The head's manifest.json: data, sizes, training (sessions, config), init, lineage, final metrics, curves."""
    from pipeline.runtime.fingerprint import environment_fingerprint

    cfg, head, seqs = run.cfg, run.head, run.sequences
    last = st.curve[-1] if st.curve else {}
    return {
        "manifest_version": MANIFEST_VERSION,
        "kind": "eagle3-draft-head",
        "target_model": cfg.model,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "data": {**(data_info or {}), "sequences": len(seqs), "train_sequences": len(run.train_idx),
                 "val_sequences": len(run.val_idx), "tokens": int(sum(run.lengths)),
                 "answer_tokens": int(sum(len(s.ids) - s.prompt_len for s in seqs)), **run.vocab_stats},
        "sizes": {"draft_vocab_size": int(len(run.vocab_ids)), "vocab_size": int(run.vocab_size),
                  "hidden_size": head.cfg.hidden_size, "intermediate_size": head.cfg.intermediate_size,
                  "num_attention_heads": head.cfg.num_attention_heads,
                  "num_key_value_heads": head.cfg.num_key_value_heads,
                  "trainable_params": int(num_params(head)), "target_layer_ids": list(head.layer_ids),
                  "weights_dtype": "bfloat16"},
        "training": {"steps": st.step, "epochs_started": st.epoch + 1, "batches_per_epoch": run.per_epoch,
                     "sessions": st.sessions,
                     "tokens_seen": st.tokens_seen, "stop_reason": stop_reason, "train_s": round(st.train_s, 1),
                     "amp": "bf16" if run.amp else "off", "config": {k: (list(v) if isinstance(v, tuple) else v)
                                                                      for k, v in dataclasses.asdict(cfg).items()}},
        "init": {k: v for k, v in st.init.items() if k != "lineage"},
        "lineage": st.init.get("lineage", []),
        "seed": cfg.seed,
        "device": str(run.dev),
        "wall_s": round(time.time() - t_start + float((data_info or {}).get("regeneration_s", 0.0)), 1),
        "final_metrics": {"train_loss": last.get("loss"), "train_acc": last.get("acc"),
                          "val_loss": val["loss"] if val else None, "val_acc": val["acc"] if val else None},
        "curve": st.curve,
        "heldout": {"sequences": len(run.heldout), "data_hash": run.heldout_hash, "curve": st.heldout_curve},
        "environment": environment_fingerprint(run.dev),
    }


def _save_head_bf16(head, out_dir: Path) -> None:
    """The head in the official format, weights stored as bfloat16 (the trained head stays fp32)."""
    save_copy = copy.deepcopy(head).to("cpu").to(torch.bfloat16).eval()
    save_copy.cfg = dataclasses.replace(head.cfg, torch_dtype="bfloat16")
    out_dir.mkdir(parents=True, exist_ok=True)
    save_head(save_copy, out_dir)
