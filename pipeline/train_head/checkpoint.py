"""A head-training run's checkpoint: what `--resume` needs to go on bit-exactly, and the checks that
refuse a checkpoint made with other data or settings.

One file, `<work_dir>/checkpoint.pt` (torch.save, written atomically): the head's trainable weights
(the target's embedding left out), the optimizer, the `TrainState` (step, data position, training
time, curves, sessions, the initialisation), the `TrainConfig` fields a resume must agree on
(`compat`), the draft vocabulary, the hash of the training sequences, and the torch / numpy / Python
RNG states. The training loop is `pipeline/train_head/train.py`.
"""
from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from pipeline.errors import DraftGymError
from pipeline.runtime.atomic import atomic_write
from pipeline.train_head.config import TrainConfig, _log

CHECKPOINT = "checkpoint.pt"
# the settings a checkpoint must agree on to be resumed
COMPAT_FIELDS = ("model", "dtype", "draft_vocab_size", "intermediate_size", "ttt_steps", "max_len", "seed",
                 "batch_size", "batch_tokens", "init", "init_from")


@dataclass
class TrainState:
    """Where a run is: everything of it that changes while it trains (checkpointed as a dict)."""
    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    train_s: float = 0.0
    tokens_seen: int = 0
    curve: list = field(default_factory=list)
    sessions: list = field(default_factory=list)    # one entry per session: when, where, steps, training time
    heldout_curve: list = field(default_factory=list)   # {step, train_s, loss, acc} on the fixed held-out set
    init: dict = field(default_factory=dict)        # calibrate_logit_scale's choice and what it measured


def compat(cfg: TrainConfig) -> dict:
    """The settings of `cfg` a checkpoint must agree on to be resumed."""
    return {k: getattr(cfg, k) for k in COMPAT_FIELDS}


def check_start(path: Path, cfg: TrainConfig) -> None:
    """A new run must not overwrite a checkpoint (unless --restart); --resume needs one."""
    if not cfg.resume and not cfg.restart and path.is_file():
        raise DraftGymError(f"{path} holds a run of this --out: pass --resume to continue it or --restart "
                            "to start over")
    if cfg.resume and not path.is_file():
        raise DraftGymError(f"--resume: no checkpoint in {path.parent} (drop --resume to start a new run)")


def save_checkpoint(path: Path, st: TrainState, cfg: TrainConfig, head, opt, vocab_ids: torch.Tensor,
                    data_hash: str, n_sequences: int) -> None:
    ck = {"head": {k: v for k, v in head.state_dict().items() if k != "embed_tokens.weight"},
          "optimizer": opt.state_dict(), "state": dataclasses.asdict(st),
          "compat": compat(cfg), "vocab_ids": vocab_ids, "config": dataclasses.asdict(cfg),
          "data_hash": data_hash, "n_sequences": n_sequences,
          "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}}
    atomic_write(path, lambda f: torch.save(ck, f))


def load_checkpoint(path: Path, cfg: TrainConfig, head, opt, vocab_ids: torch.Tensor, data_hash: str,
                    n_sequences: int) -> TrainState:
    """Restore the head, the optimizer and the RNGs from `path` and return the run's state; a
    checkpoint made with other settings, other data or another draft vocabulary is refused in one line."""
    ck = torch.load(path, map_location="cpu", weights_only=False)
    if ck.get("compat") != compat(cfg):
        theirs = ck.get("compat") or {}
        diff = ", ".join(f"{k} {theirs.get(k)!r} -> {v!r}" for k, v in compat(cfg).items() if theirs.get(k) != v)
        raise DraftGymError(f"--resume: checkpoint {path} was made with other settings ({diff}); "
                            "use the same settings, or --restart")
    if ck.get("data_hash") not in (None, data_hash):
        raise DraftGymError(f"--resume: checkpoint {path} was trained on other data ({ck.get('n_sequences')} "
                            f"sequences, hash {ck['data_hash']}; now {n_sequences}, hash {data_hash}); "
                            "freeze the dataset the run started with, or --restart")
    if not torch.equal(ck["vocab_ids"], vocab_ids):
        raise DraftGymError(f"--resume: checkpoint {path} has another draft vocabulary (other data?)")
    head.load_state_dict(ck["head"], strict=False)
    opt.load_state_dict(ck["optimizer"])
    st = TrainState(**ck["state"])
    torch.set_rng_state(ck["rng"]["torch"])
    np.random.set_state(ck["rng"]["numpy"])
    random.setstate(ck["rng"]["python"])
    _log(f"resumed from {path} at step {st.step} (epoch {st.epoch}, batch {st.batch_in_epoch})")
    return st
