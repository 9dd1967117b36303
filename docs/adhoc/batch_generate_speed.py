"""Batched generation and batched collection speed on the embedded default (log H5, O5).

Per dtype (fp32, bf16): `pipeline.decode.continuations.generate_batch` greedy tokens/s at batch 1, 4, 16,
64 (48 new tokens, max(b, 4) MT-bench + ShareGPT train prompts of <= 256 tokens, a finished row
refilled from the queue; where the first 4 rows differ from batch 1, the lossless near-tie verdict), HF
`model.generate` (left padding, DynamicCache) at batch 16 on the same prompts for comparison, then
collection positions/s on 8 prompts: `collect_prompt` one by one against `collect_prompts` (both
generate their continuations; default head, W = 10).

    .venv/bin/python docs/adhoc/batch_generate_speed.py [DTYPES]
"""
import argparse
import time

import torch

from pipeline.collect.prompt import CollectConfig, collect_prompt, collect_prompts
from pipeline.datasets import load_prompts
from pipeline.decode.continuations import generate_batch
from pipeline.decode.engine.single import Engine
from pipeline.decode.lossless import classify, summarize_verdicts
from pipeline.models.head import load_head_for
from pipeline.models.target import encode_prompt, load_target
from pipeline.runtime.fingerprint import cpu_model

NEW, MAX_PROMPT = 48, 256


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dtypes", nargs="?", default="float32,bfloat16", help="comma-separated")
    dtypes = ap.parse_args(argv).dtypes.split(",")
    print(f"cpu: {cpu_model()}  threads: {torch.get_num_threads()}")
    prompts = None
    for dt in dtypes:
        t = load_target("smollm2-135m", dtype=dt)
        eng = Engine(t.model, load_head_for("default", t.model), t.eos_token_ids)
        if prompts is None:
            recs = load_prompts("mt-bench", "train") + load_prompts("sharegpt", "train", n=400)
            ids = (encode_prompt(t.tokenizer, list(r.messages)) for r in recs)
            prompts = [p for p in ids if len(p) <= MAX_PROMPT][:64]
            print(f"prompts: {len(prompts)} (mt-bench + sharegpt train, <= {MAX_PROMPT} tokens), "
                  f"mean length {sum(map(len, prompts[:16])) / 16:.0f} (first 16)")
        generate_batch(eng.model, prompts[:2], 4, eos_token_ids=eng.eos, batch_size=2)        # warm-up
        first4 = {}
        for b in (1, 4, 16, 64):
            ps = prompts[: max(b, 4)]
            t0 = time.perf_counter()
            res = generate_batch(eng.model, ps, NEW, 0.0, 0, eng.eos, batch_size=b)
            wall = time.perf_counter() - t0
            first4[b] = [r.output_ids for r in res[:4]]
            n_tok = sum(len(r.output_ids) for r in res)
            print(f"{dt} generate_batch  batch {b:3d}: {len(ps)} prompts, {n_tok} tokens, {wall:6.1f} s, "
                  f"{n_tok / wall:6.1f} tok/s")
        print(f"{dt} the first 4 prompts' outputs equal at batch 1, 4, 16, 64: "
              f"{[first4[b] == first4[1] for b in (4, 16, 64)]}")
        # where a row parts from its batch-1 output: the lossless rule's verdict (near-tie within the
        # dtype's rounding of the top-2 logit gap, or a mismatch = a bug), batch-1 output as the reference
        verdicts = [classify(eng.model, prompts[i], first4[1][i], first4[b][i]) for b in (4, 16, 64) for i in range(4)]
        print(f"{dt} batch 4/16/64 against batch 1, first 4 prompts: {summarize_verdicts(verdicts)['counts']}; "
              + "; ".join(f"k={v.k} gap {v.gap_ulps:.1f} ulp" for v in verdicts if v.status != "exact"))
        ps = prompts[:16]
        P = max(map(len, ps))
        ids = torch.zeros(16, P, dtype=torch.long)
        att = torch.zeros(16, P, dtype=torch.long)
        for r, p in enumerate(ps):
            ids[r, P - len(p):], att[r, P - len(p):] = torch.tensor(p), 1
        eos = sorted(eng.eos)
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = eng.model.generate(input_ids=ids, attention_mask=att, do_sample=False, max_new_tokens=NEW,
                                     pad_token_id=eos[0], eos_token_id=eos, num_beams=1)
        wall = time.perf_counter() - t0
        n_tok = 0
        for row in out[:, P:].tolist():
            n_tok += next((j + 1 for j, x in enumerate(row) if x in eng.eos), len(row))
        print(f"{dt} HF generate     batch  16: 16 prompts, {n_tok} tokens, {wall:6.1f} s, {n_tok / wall:6.1f} tok/s")
        cfg = CollectConfig(dtype=dt, max_new_tokens=NEW, widths=(10,))
        ps = prompts[:8]
        for name, fn in (("per-prompt", lambda: [collect_prompt(eng, eng.head, p, cfg) for p in ps]),
                         ("batched   ", lambda: collect_prompts(eng, eng.head, ps, cfg))):
            t0 = time.perf_counter()
            logs = fn()
            wall = time.perf_counter() - t0
            n_pos = sum(len(lg.positions[10]["position"]) for lg in logs)
            print(f"{dt} collection {name}: 8 prompts, {n_pos} positions, {wall:6.1f} s, {n_pos / wall:6.1f} positions/s")


if __name__ == "__main__":
    main()
