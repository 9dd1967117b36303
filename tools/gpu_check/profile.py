"""The GPU check's profile step: a latency profile of the 8B-shaped target on this GPU, as a normal
`draftgym profile` writes it (GPU cost curves for `tune`, `serve-eval`, `train-load`).

`pipeline.profiling.profile.profile_engine` runs unchanged on the check's random-weight target and
random head: batch 1 and every B of `profile_batch_sizes` on the one engine's own steps, with CUDA
graphs (each (B, c) one generation playing the grid's shapes round-robin; batch 1 is B = 1 of the
same path), the prefill at each length; suspect cells
re-measured once (pipeline/profiling/trust.py). Prompts are random token ids (no tokenizer: the
weights are random, so any ids are as good as text). The random head is never accepted (tau = 1),
which changes nothing the profile measures: every cycle drafts, verifies and commits as a trained
head's would, only its accepted lengths differ (and with them the rows' contexts, which grow by 1
token a step instead of tau).

Batch sizes and prefill lengths not started before the step's deadline are left out and named.
The profile's Parquet comes back as `gpu_profile.parquet` (the check's folder holds no subfolders);
put it under a logs root's `latency/` folder, e.g. `<root>/latency/model=llama-3.1-8b/`, and
`draftgym tune --latency <root>` reads it. Its rows' model_id is the check's target name
(`llama-3.1-8b`), its device string names the GPU, the SDPA kernels and the dtype.
"""
from __future__ import annotations

import shutil
import time
from pathlib import Path

import torch

PROFILE_FILE = "gpu_profile.parquet"


def gpu_profile(cfg, deadline: float, model, head, work: Path, out: Path) -> dict:
    """profile_engine on the check's target into `work`, copied to out/gpu_profile.parquet; a summary."""
    from pipeline.decode.engine.single import Engine
    from pipeline.profiling.profile import profile_engine
    from simulator.latency.model import LatencyModel

    vocab = model.config.vocab_size
    prompt = lambda c, r: torch.randint(0, vocab, (c,), generator=torch.Generator().manual_seed(7919 * c + r)).tolist()
    t0 = time.perf_counter()
    res = profile_engine(Engine(model, head), None, cfg.target, str(work / "profile"), widths=cfg.profile_widths,
                         verify_sizes=cfg.profile_verify_sizes, contexts=cfg.profile_contexts,
                         repeats=cfg.profile_repeats, progress=False,
                         batch_sizes=cfg.profile_batch_sizes, prefill_lengths=cfg.profile_prefill_lengths,
                         prompt=prompt, deadline=deadline)
    shutil.copy(res["path"], out / PROFILE_FILE)
    lat = LatencyModel.from_logs(work / "profile", model=cfg.target, trust=True)
    c0 = min(cfg.profile_contexts)
    ar = {B: 1e3 * float(lat.t_ar(c0, batch=B)) for B in lat.batch_levels}
    verify = {B: {V: 1e3 * float(lat.t_verify(V, c0, batch=B)) for V in cfg.profile_verify_sizes} for B in lat.batch_levels}
    return {"status": "ok" if not res["left_out"] else "partial",
            "reason": f"time budget: left out {', '.join(res['left_out'])}" if res["left_out"] else None,
            "file": PROFILE_FILE, "profile_id": res["profile_id"], "device": res["device"], "rows": res["rows"],
            "batch_levels": lat.batch_levels, "contexts": list(cfg.profile_contexts), "remeasured": res["remeasured"],
            "suspect": lat.meta["suspect"], "left_out": res["left_out"], "seconds": time.perf_counter() - t0,
            "context": c0, "ar_ms": ar, "verify_ms": verify}
