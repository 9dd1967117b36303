"""vLLM's speculation counters, replayed on the logs: what `draftgym vllm-run` measures, predicted.

vLLM (v1/spec_decode/metrics.py) counts, per verify step of a request with k draft tokens:

    num_drafts += 1,  num_draft_tokens += k,  num_accepted_tokens += L,
    num_accepted_tokens_per_pos[i] += 1 for i < L          (L: the drafts the target accepted, 0..k)

and reports the mean acceptance length 1 + num_accepted_tokens / num_drafts and the per-position
acceptance num_accepted_tokens_per_pos[i] / num_drafts. The replay walks each logged sequence with the
chain of k drafts (the width-1 acceptance table: L at each root position) exactly as decoding does,
p -> p + L + 1 until the sequence's T - 1 cycle tokens are out, and counts the same things. At T = 0 a
chain's accepted length does not depend on the batch it runs in, so one walk predicts every B.
"""
from __future__ import annotations

import numpy as np

from pipeline.decode import step_shape
from pipeline.errors import DataError
from simulator.serving.inputs import replayable
from simulator.serving.replay import ShapeTable


def chain_counters(logs, k: int) -> dict:
    """vLLM's counters for a static chain of k drafts over every logged sequence: {num_drafts, num_draft_tokens,
    num_accepted_tokens, num_accepted_tokens_per_pos, mean_acceptance_length, acceptance_per_pos, sequences}."""
    if k < 1:
        raise DataError(f"a chain needs k >= 1 drafts, got {k}")
    shape = step_shape.chain(k)
    if not replayable(logs, shape):
        raise DataError(f"the logs cannot replay chain:{k} (collect them with --widths 1 and --max-depth >= {k})")
    table = ShapeTable(logs, [shape])
    per_pos = np.zeros(k, np.int64)
    drafts = 0
    for s in range(logs.n_sequences):
        p, end = 0, int(logs.new_tokens[s]) - 1
        while p < end:
            L = int(table.accepted([logs.offsets[s] + p], 0)[0])
            drafts += 1
            per_pos[:L] += 1
            p += L + 1
    acc = int(per_pos.sum())
    return {"num_drafts": drafts, "num_draft_tokens": drafts * k, "num_accepted_tokens": acc,
            "num_accepted_tokens_per_pos": per_pos.tolist(), "sequences": int(logs.n_sequences),
            **spec_figures({"num_drafts": drafts, "num_accepted_tokens": acc, "num_accepted_tokens_per_pos": per_pos})}


def spec_figures(c: dict) -> dict:
    """Counters (vLLM's or the replay's) -> mean acceptance length and per-position acceptance."""
    n = max(int(c.get("num_drafts", 0)), 0)
    per = [float(x) / n for x in c.get("num_accepted_tokens_per_pos", [])] if n else []
    return {"mean_acceptance_length": 1.0 + (c.get("num_accepted_tokens", 0) / n if n else 0.0),
            "acceptance_per_pos": per}
