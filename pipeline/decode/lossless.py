"""Lossless at T = 0, defined for every dtype: exact, near-tie or mismatch.

In fp32 EAGLE-3's greedy output equals AR output token for token (the tests show it), and that is
the rule: `exact` or `mismatch`. In reduced precision the same target computes a token's logit
differently in a V-token verify forward and in a 1-token AR forward (other matmul shapes, other
summation orders, each rounded to 8 (bf16) or 11 (fp16) significant bits). Where the target's two
best tokens are that close, the argmax can flip, and the outputs part: harmless, and not a bug.

Classification of one prompt (spec = EAGLE-3 output ids, ar = AR output ids, same prompt, T = 0):

    exact     spec == ar
    near-tie  reduced precision only: at the first differing index k, with a = ar[k], b = spec[k]
              and l = the target's logits at k as AR decoding computed them (prompt prefill, then
              one 1-token forward per token of ar[:k]: the very computation that chose a),
                  gap = |l[a] - l[b]|  <=  tol = NEAR_TIE_ULPS[dtype] * ulp_dtype(max_v |l[v]|)
    mismatch  anything else: an fp32 difference, a gap above tol, or one output a strict prefix of
              the other (nothing "tied" there: one method stopped early)

ulp_dtype(x) = 2^(floor(log2 x) - m), m = the dtype's explicit mantissa bits (bf16 7, fp16 10): the
spacing of representable numbers at x. The scale is the row's largest |logit|, not the two logits
themselves: a logit is a dot product h . w_v accumulated at the size of the whole row, and its
rounding error follows that size even when the logit itself is near zero (with the two tokens'
own ulp the moves below reach 19 ulps, with the row's they stay within 4).

Why NEAR_TIE_ULPS = 6 for bf16. `rounding_noise` measures, at every position of AR-decoded
sequences, how far the top-2 logit gap moves between AR's 1-token forward and a chunked
multi-token forward over the same positions (a verify). On the embedded default in bf16
(1440 position-paths, chunks of 8 and 60 tokens) |move| has median 0.5, p99 2,
max 4 ulps. The verify flipped the AR argmax only if AR's own gap was within that move, so a gap
<= 4 ulps in AR's computation is what a rounding flip can produce; 6 is that bound with 1.5x
margin. A real acceptance bug emits tokens the target ranks lower by whole logits at most of its
divergences: the tests show a biased acceptance rule classified `mismatch`, not `near-tie`.
fp16 has 3 more mantissa bits; the same 6 ulps (of a finer ulp) is kept until measured on fp16.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

from pipeline.runtime.fingerprint import dtype_name

MANTISSA_BITS = {torch.float32: 23, torch.bfloat16: 7, torch.float16: 10}
# tolerance in ulps of the row's largest |logit| (module docstring); fp32 has none: exact only
NEAR_TIE_ULPS = {torch.bfloat16: 6.0, torch.float16: 6.0}
STATUSES = ("exact", "near-tie", "mismatch")


def ulp(x: float, dtype: torch.dtype) -> float:
    """Spacing of `dtype`'s representable numbers at |x| (normal range)."""
    x = max(abs(float(x)), 2.0 ** -14)
    return 2.0 ** (math.floor(math.log2(x)) - MANTISSA_BITS[dtype])


def near_tie_tolerance(row_max_abs_logit: float, dtype: torch.dtype) -> float:
    """tol of the module docstring; 0 where the rule is strict (fp32)."""
    k = NEAR_TIE_ULPS.get(dtype, 0.0)
    return k * ulp(row_max_abs_logit, dtype) if k else 0.0


@dataclass
class LosslessVerdict:
    """One prompt's classification. k: first differing index in the new tokens (None if exact)."""

    status: str                      # exact | near-tie | mismatch
    k: int | None = None
    ar_token: int | None = None
    spec_token: int | None = None
    logit_ar: float | None = None    # the target's logits at k, as AR decoding computed them
    logit_spec: float | None = None
    gap: float | None = None         # |logit_ar - logit_spec|
    tol: float | None = None
    gap_ulps: float | None = None    # gap / ulp(row's max |logit|)
    dtype: str = "float32"

    def to_dict(self) -> dict:
        return asdict(self)


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token; len(shorter) if one is a strict prefix; None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@torch.inference_mode()
def ar_logits_at(model, prompt_ids: list[int], ar_ids: list[int], k: int) -> torch.Tensor:
    """The logits [vocab] (fp32 view) that AR decoding computed for new token k: the prompt's prefill,
    then 1-token forwards of ar[0..k-1], the same calls as `Engine.generate_ar` (so on a deterministic
    backend the same bits)."""
    from transformers import DynamicCache

    from pipeline.decode.verify import target_forward

    dev = next(model.parameters()).device
    cache = DynamicCache(config=model.config)
    n = len(prompt_ids)
    logits, _ = target_forward(model, torch.tensor([prompt_ids], device=dev), torch.arange(n, device=dev)[None],
                               cache, hidden_states=False, last_only=True)
    for i in range(k):
        logits, _ = target_forward(model, torch.tensor([[ar_ids[i]]], device=dev), torch.tensor([[n + i]], device=dev),
                                   cache, hidden_states=False)
    return logits[-1]


def classify(model, prompt_ids: list[int], ar_ids: list[int], spec_ids: list[int],
             dtype: torch.dtype | None = None) -> LosslessVerdict:
    """Classify one prompt's EAGLE-3 output against its AR output (module docstring)."""
    dtype = dtype or next(model.parameters()).dtype
    name = dtype_name(dtype)
    k = first_difference(ar_ids, spec_ids)
    if k is None:
        return LosslessVerdict("exact", dtype=name)
    if k >= min(len(ar_ids), len(spec_ids)):         # one stopped early: no token pair to compare
        return LosslessVerdict("mismatch", k=k, dtype=name)
    a, b = int(ar_ids[k]), int(spec_ids[k])
    logits = ar_logits_at(model, prompt_ids, ar_ids, k)
    la, lb, scale = float(logits[a]), float(logits[b]), float(logits.abs().max())
    gap, tol = abs(la - lb), near_tie_tolerance(scale, dtype)
    status = "near-tie" if (tol > 0 and gap <= tol) else "mismatch"
    gap_ulps = gap / ulp(scale, dtype) if dtype in MANTISSA_BITS else None
    return LosslessVerdict(status, k=k, ar_token=a, spec_token=b, logit_ar=la, logit_spec=lb, gap=gap, tol=tol,
                           gap_ulps=gap_ulps, dtype=name)


def summarize_verdicts(verdicts: list[LosslessVerdict]) -> dict:
    """Counts per status, and each near-tie / mismatch with its k and gap (for reports)."""
    counts = {s: sum(v.status == s for v in verdicts) for s in STATUSES}
    return {"counts": counts, "ok": counts["mismatch"] == 0,
            "divergences": [v.to_dict() for v in verdicts if v.status != "exact"]}


@torch.inference_mode()
def rounding_noise(model, sequences: list[list[int]], start: int, chunk: int = 8) -> dict:
    """How far the top-2 logit gap moves between two computations of the same logits.

    For each sequence (prompt + AR continuation; positions >= start are scored): path A runs the
    target one token at a time over a KV cache (AR decoding); path B runs it `chunk` tokens at a
    time over a KV cache (a verify of `chunk` tokens). At each position, with a, b the top-2 tokens
    of path A: move = (lA[a] - lA[b]) - (lB[a] - lB[b]). Returns the moves in logits and in ulps
    of the row's largest |logit| (path A), plus the gaps of path A (in ulps), as lists."""
    from transformers import DynamicCache

    dtype = next(model.parameters()).dtype
    dev = next(model.parameters()).device
    moves, moves_ulp, gaps_ulp = [], [], []
    for seq in sequences:
        ids = torch.tensor([seq], device=dev)
        rows = {}
        for step in (1, chunk):
            cache = DynamicCache(config=model.config)
            model(input_ids=ids[:, :start], use_cache=True, cache=cache, logits_to_keep=1)      # fills the cache
            out = []
            for s in range(start, len(seq), step):
                e = min(s + step, len(seq))
                r = model(input_ids=ids[:, s:e], position_ids=torch.arange(s, e, device=dev)[None],
                          use_cache=True, cache=cache)
                out.append(r.logits[0].float())
            rows[step] = torch.cat(out)                  # [len(seq) - start, vocab]
        la, lb = rows[1], rows[chunk]
        top2 = la.topk(2, dim=-1).indices                # [n, 2]
        ga = la.gather(1, top2)
        gb = lb.gather(1, top2)
        scale = la.abs().amax(-1)                        # [n] the row's largest |logit|
        for (a1, a2), (b1, b2), m in zip(ga.tolist(), gb.tolist(), scale.tolist()):
            u = ulp(m, dtype) if dtype in MANTISSA_BITS else 1.0
            mv = (a1 - a2) - (b1 - b2)
            moves.append(mv)
            moves_ulp.append(mv / u)
            gaps_ulp.append((a1 - a2) / u)
    return {"dtype": dtype_name(dtype), "chunk": chunk, "moves": moves, "moves_ulp": moves_ulp,
            "gaps_ulp": gaps_ulp}
