"""One prefill of the embedded default with every position's logits against the last one's only
(`logits_to_keep` 0 / 1, what `target_forward(..., last_only=True)` asks for), fp32 and bf16, 150
and 300 random prompt tokens: the minimum of 3 timed calls after one warm-up (log U2).

    .venv/bin/python docs/adhoc/prefill_last_logits.py
"""
import argparse
import time

import torch
from transformers import DynamicCache

from pipeline.models.target import load_target


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.parse_args(argv)
    for dt in ("float32", "bfloat16"):
        m = load_target("smollm2-135m", dtype=dt).model
        for n in (150, 300):
            ids, pos = torch.randint(0, m.config.vocab_size, (1, n)), torch.arange(n)[None]
            for keep in (0, 1):
                ts = []
                for _ in range(4):
                    t0 = time.perf_counter()
                    with torch.inference_mode():
                        out = m(input_ids=ids, position_ids=pos, past_key_values=DynamicCache(config=m.config),
                                use_cache=True, output_hidden_states=True, logits_to_keep=keep)
                    ts.append(time.perf_counter() - t0)
                print(f"{dt} {n} tokens, logits_to_keep={keep}: {min(ts[1:]):.3f} s, logits {tuple(out.logits.shape)}",
                      flush=True)


if __name__ == "__main__":
    main()
