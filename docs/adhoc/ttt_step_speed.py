"""Head-training step cost and the cross-entropy at initialisation, on the embedded default (docs/benchmarks/I.md, I4).

One batch of self-distilled-like sequences (train-split MT-bench + ShareGPT prompts with the target's
own greedy answers, 4096 padded tokens at most), bf16 autocast as the trainer runs on a CPU with bf16
units. Times forward + backward of the TTT loss for the code of commit 78cdaa2 (labels recomputed at
each step, lm_head on every row) against pipeline.train_head.ttt.ttt_loss (labels once, lm_head on labelled rows
only), for K = 4 and 7 TTT steps, median of 3 after a warm-up; the heads are the same and the losses
must agree. Then the per-step cross-entropy at initialisation for --init random / target /
passthrough, before and after the logit-scale calibration.

    .venv/bin/python docs/adhoc/ttt_step_speed.py
"""
import math
import subprocess
import sys
import time
import types

import torch

from pipeline.decode.batch_generate import generate_batch
from pipeline.datasets import load_prompts
from pipeline.runtime.fingerprint import cpu_model
from pipeline.decode.target import encode_prompt, load_target
from pipeline.train_head.config import TrainConfig
from pipeline.train_head.batches import pad_batch
from pipeline.train_head.features import batch_features
from pipeline.train_head.initialise import build_draft_vocab
from pipeline.train_head.initialise import build_head, calibrate_logit_scale
from pipeline.train_head.data import TrainSequence
from pipeline.train_head.ttt import ttt_loss

old_src = subprocess.run(["git", "show", "78cdaa2:pipeline/train_draft.py"], capture_output=True, text=True, check=True).stdout
old = types.ModuleType("old_train_draft")
sys.modules["old_train_draft"] = old                       # dataclasses look their module up
exec(compile(old_src, "old_train_draft.py", "exec"), old.__dict__)

print(f"cpu: {cpu_model()}  threads: {torch.get_num_threads()}")
t = load_target("smollm2-135m", dtype="bfloat16")
recs = load_prompts("mt-bench", "train") + load_prompts("sharegpt", "train", n=200)
prompts = [p for p in (encode_prompt(t.tokenizer, list(r.messages)) for r in recs) if len(p) <= 200][:24]
answers = generate_batch(t.model, prompts, 160, 0.0, 0, t.eos_token_ids, batch_size=24)
seqs = [TrainSequence(p + a.output_ids, len(p)) for p, a in zip(prompts, answers)]
seqs = sorted(seqs, key=lambda s: len(s.ids))
idx, T = [], 0
for i, s in enumerate(seqs):                    # as many as fit 4096 padded tokens (<= 16)
    if len(idx) == 16 or (len(idx) + 1) * max(T, len(s.ids)) > 4096:
        break
    idx.append(i)
    T = max(T, len(s.ids))
vocab_ids, _ = build_draft_vocab(seqs, 8192, t.model.config.vocab_size)
ids, lens, pl, T = pad_batch(seqs, idx, torch.device("cpu"))
ft = load_target("smollm2-135m", dtype="float32").model
feats = batch_features(ft, (2, 15, 27), seqs, idx, T, torch.device("cpu"), True, None)
lm_w = ft.get_output_embeddings().weight[vocab_ids].float()
t2d = torch.full((ft.config.vocab_size,), -1, dtype=torch.long)
t2d[vocab_ids] = torch.arange(len(vocab_ids))
print(f"batch: {len(idx)} sequences x {T} tokens, {int((lens - pl).sum())} answer tokens")

for K in (4, 7):
    res = {}
    for name, fn in (("78cdaa2", old.ttt_loss), ("now", ttt_loss)):
        head = build_head(ft, vocab_ids, TrainConfig(init="target"))
        times = []
        for r in range(4):
            t0 = time.perf_counter()
            loss, losses, _ = fn(head, ids, lens, pl, *feats, lm_w, t2d, K, 0.8, True)
            loss.backward()
            times.append(time.perf_counter() - t0)
            head.zero_grad(set_to_none=True)
        res[name] = (sorted(times[1:])[1], float(loss))
    print(f"K={K}: 78cdaa2 {res['78cdaa2'][0]:.2f} s, now {res['now'][0]:.2f} s "
          f"({res['78cdaa2'][0] / res['now'][0]:.2f}x); loss {res['78cdaa2'][1]:.4f} vs {res['now'][1]:.4f}")

print(f"cross-entropy per TTT step at initialisation (ln 8192 = {math.log(8192):.3f}), K = 7:")
for init in ("random", "target", "passthrough"):
    head = build_head(ft, vocab_ids, TrainConfig(init=init))
    with torch.no_grad():
        _, raw, st = ttt_loss(head, ids, lens, pl, *feats, lm_w, t2d, 7, 0.8, True)
    acc = [c / max(n, 1) for c, n in st]
    line = f"  {init:11s} as built: " + " ".join(f"{x:.2f}" for x in raw) + f" | step-0 acc {acc[0]:.3f}"
    if init != "random":
        cal = calibrate_logit_scale(head, (ids, lens, pl, *feats, lm_w, t2d), 7, 0.8, True)
        line += f" | calibrated (scale {cal['logit_scale']}): " + " ".join(f"{x:.2f}" for x in cal["ce_per_step"])
    print(line)
