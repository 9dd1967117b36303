"""`draftgym train-draft`: train an EAGLE-3 draft head for a target (self-distillation + TTT).

Pipeline (SpecForge-style; CleanRL-style hyperparameters in `TrainConfig`, pipeline/train_head/config.py).
One module per stage: data and self-distillation (pipeline/train_head/data.py), features
(pipeline/train_head/features.py), head initialisation (pipeline/train_head/initialise.py), the TTT step
(pipeline/train_head/ttt.py), batching (pipeline/train_head/batches.py), checkpoints
(pipeline/train_head/checkpoint.py), the training loop (pipeline/train_head/loop.py), and the command here:

  1. Self-distillation. The target regenerates greedy answers to the train-split prompts (batched,
     `pipeline.decode.continuations`: slots refilled from the queue). Answers are appended to a JSONL cache
     per generation setting, so a killed run resumes where it stopped. Before training, the
     sequences are frozen into one Parquet of token ids (`dataset-<hash>.parquet` in the work dir,
     its sha256 in the manifest); `--data` trains on such a file without any regeneration.
  1b. Initialisation (`--init`, default passthrough: lm_head and norm from the target, fc passing
     the highest fused layer through, attention and MLP outputs zero), then the lm_head scaled by
     the factor that gives the lowest TTT loss on the first batch, so the first cross-entropy is
     at or below ln(draft vocab) (initialise.calibrate_logit_scale).
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
  4. Training-time test (TTT), matching `pipeline.decode.engine.single` / `pipeline.decode.draft` at inference:
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

import dataclasses
import hashlib
import json
import time
from collections import Counter
from pathlib import Path

from pipeline.models.head import resolve_head_dir
from pipeline.errors import DraftGymError
from pipeline.train_head.config import TrainConfig, _hash, _log, _slug
from pipeline.train_head.data import (TrainSequence, default_work_dir, freeze_sequences, load_frozen, regenerate,
                                      select_prompts, select_reference_sequences)
from pipeline.train_head.loop import train_head


def _gen_key(cfg: TrainConfig) -> str:
    """The answers' generation setting: the JSONL caches of the training and held-out answers are keyed by it."""
    return _hash({"model": cfg.model, "max_new_tokens": cfg.max_new_tokens, "gen_dtype": cfg.gen_dtype, "v": 1})


def run_train_draft(cfg: TrainConfig, progress_bar: bool = True) -> dict:
    """The whole command: load the target, regenerate answers (or read a frozen dataset), freeze the
    data, train, save."""
    from pipeline.models.target import load_target

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


def run_train_draft_command(cfg: TrainConfig, progress: bool = True) -> int:
    """`draftgym train-draft`: `run_train_draft`, then one JSON line (the head's path, steps, final metrics)."""
    manifest = run_train_draft(cfg, progress_bar=progress)
    fm = manifest["final_metrics"]
    print(json.dumps({"out": str(cfg.out), "steps": manifest["training"]["steps"], **fm}))
    return 0
