"""`draftgym train-draft`'s hyperparameters (`TrainConfig`, CleanRL-style: the CLI flags map 1:1 onto
its fields), the TTT-step curriculum, the learning-rate schedule and the trainer's small shared helpers.
The training loop is `pipeline/train_head/loop.py`, the command `pipeline/train_head/train.py`."""
from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import dataclass

import torch

from pipeline.errors import DraftGymError


MANIFEST_VERSION = 1


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
    gen_batch_size: int = 64                 # prompts per batched generate call (tokens/s still grows up to 64)
    gen_dtype: str = "bfloat16"              # dtype of the generation copy of the target
    regen_budget_min: float | None = None    # stop regenerating after this long and train on what is done
    reference_prompts: int = 0               # extra train prompts trained on with the dataset's own reference
                                             # answer as text (labels are still the target's distributions)
    reference_datasets: tuple = ("sharegpt",)  # where those come from (records that have a reference)
    max_len: int = 512                       # prompt + answer tokens kept per training sequence
    # -- head
    draft_vocab_size: int = 8192
    intermediate_size: int | None = None     # None: the target's (smaller trains faster; recorded in config)
    init: str = "passthrough"                # 'passthrough' | 'target' | 'random' (see build_head)
    init_from: str | None = None             # warm start from a saved head (its weights and draft vocabulary;
                                             # a new schedule and optimizer): how a run goes on where its
                                             # checkpoint is gone (another machine), from the committed head
    # -- training-time test
    ttt_steps: int = 7                       # unrolled draft steps (EAGLE-3 uses 7)
    ttt_decay: float = 0.8                   # loss weight of step i is decay**i
    ttt_curriculum: tuple = ()               # ('K@f', ...): K TTT steps from schedule progress f on (f in [0, 1),
                                             # the first f must be 0; K <= ttt_steps); () = ttt_steps throughout
    # -- optimisation
    steps: int | None = None                 # optimizer steps; None: `epochs` passes over the data
    epochs: float | None = None              # None: 1 epoch, or unlimited when a time budget is given
    time_budget_min: float | None = None     # the run's total training time, over all sessions: the schedule
                                             # decays over it, and the run stops (and saves) when it is spent
    session_budget_min: float | None = None  # stop (checkpoint + head) after this much training in this session;
                                             # the schedule is unchanged, so a later --resume goes on along it
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
    val_fraction: float = 0.03               # held-out sequences (of the training prompts) for the final evaluation
    heldout_prompts: int = 64                # val-split prompts with the target's own answers (on-policy), the
                                             # fixed held-out set whose accuracy curve the manifest records; 0 = none
    eval_every: int = 100                    # steps between held-out evaluations (and one at the end)
    max_val_sequences: int = 64
    # -- bookkeeping
    seed: int = 0
    device: str | None = None                # default: cuda when available, else cpu
    out: str = ""                            # head directory (config.json, model.safetensors, manifest.json)
    data: str | None = None                  # a frozen dataset (Parquet from an earlier run): no selection or
                                             # regeneration; default: select, regenerate, freeze into the work dir
    work_dir: str | None = None              # caches + checkpoints; default $DRAFTGYM_CACHE/train-draft/<model>
    resume: bool = False                     # continue the checkpoint of this --out (refused if the data changed)
    restart: bool = False                    # start over although a checkpoint of this --out exists
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
        if self.init not in INITS:
            raise DraftGymError(f"init must be one of {', '.join(INITS)}, got {self.init!r}")
        if self.amp not in ("auto", "bf16", "none"):
            raise DraftGymError(f"amp must be auto, bf16 or none, got {self.amp!r}")
        if self.time_budget_min is not None and self.time_budget_min <= 0:
            raise DraftGymError(f"time budget must be > 0 minutes, got {self.time_budget_min}")
        if self.session_budget_min is not None and self.session_budget_min <= 0:
            raise DraftGymError(f"session budget must be > 0 minutes, got {self.session_budget_min}")
        if self.resume and self.restart:
            raise DraftGymError("--resume and --restart exclude each other")
        parse_curriculum(self.ttt_curriculum, self.ttt_steps)


def parse_curriculum(spec, max_steps: int) -> list[tuple[float, int]]:
    """('4@0', '7@0.5') -> [(0.0, 4), (0.5, 7)]: the TTT steps used from each schedule progress on."""
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    spec = ",".join(items)                                   # as the user typed it, for messages
    out = []
    for it in (x.strip() for x in items):
        if not it:
            continue
        k, _, f = it.partition("@")
        try:
            out.append((float(f), int(k)))
        except ValueError:
            raise DraftGymError(f"bad TTT curriculum entry {it!r}: use K@FRACTION, e.g. 4@0,7@0.5") from None
    if not out:
        return []
    if out[0][0] != 0 or any(b[0] <= a[0] for a, b in zip(out, out[1:])) or out[-1][0] >= 1:
        raise DraftGymError(f"TTT curriculum {spec!r}: fractions must start at 0, increase and stay below 1")
    if any(not 1 <= k <= max_steps for _, k in out):
        raise DraftGymError(f"TTT curriculum {spec!r}: every K must be in 1..ttt_steps ({max_steps})")
    return out


def ttt_steps_at(curriculum: list[tuple[float, int]], max_steps: int, progress: float) -> int:
    """TTT steps at schedule progress p: the K of the last curriculum entry with fraction <= p."""
    k = max_steps
    for f, kk in curriculum:
        if progress >= f:
            k = kk
    return k


INITS = ("passthrough", "target", "random")


def lr_at(cfg: TrainConfig, step: int, progress: float) -> float:
    """Linear warm-up over `warmup_steps`, then cosine from lr to lr*min_lr_ratio over progress."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    p = min(max(progress, 0.0), 1.0)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * p)))


def _hash(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:12]


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name.strip("/").replace("/", "--"))[:80]


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


def _log(msg: str) -> None:
    print(f"[train-draft {time.strftime('%H:%M:%S')}] {msg}", flush=True)
