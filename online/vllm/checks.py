"""`draftgym vllm-run`'s checks: outputs against the lossless reference, and DraftGym's own AR.

    same_outputs          one set of outputs against another: identical count, first divergences
    lossless              each speculative run's outputs against the same run without speculation
    classify_divergences  reduced precision: each divergence classified exact / near-tie / mismatch by
                          pipeline/decode/lossless.py's rule (the target's top-2 gap at the first differing
                          token, as DraftGym's AR computes it in the same dtype, against NEAR_TIE_ULPS)
    draftgym_ar           DraftGym's AR continuations of the same token ids (fp32: vLLM's must equal them)
"""
from __future__ import annotations

from pipeline.decode.continuations import generate_batch
from pipeline.decode.lossless import classify, summarize_verdicts
from pipeline.models.target import load_target


def first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def same_outputs(outputs: dict, ref: dict) -> dict:
    """{index: token ids} against the reference's: {identical, of, first_divergence: {index: k}}."""
    div = {i: first_divergence(o, ref.get(i, [])) for i, o in outputs.items()}
    bad = {i: d for i, d in div.items() if d is not None}
    return {"identical": len(div) - len(bad), "of": len(div), "first_divergence": bad}


def lossless(runs: dict, ref: dict) -> dict:
    """Each run's outputs against the reference config's same run."""
    return {name: same_outputs(r["outputs"], ref[name]["outputs"]) for name, r in runs.items() if name in ref}


def draftgym_ar(cfg, prompts: list[list[int]], dtype: str) -> list[list[int]]:
    t = load_target(cfg.model, device="cpu", dtype=dtype)
    conts = generate_batch(t.model, prompts, cfg.max_new_tokens, eos_token_ids=t.eos_token_ids, batch_size=len(prompts))
    return [list(c.output_ids) for c in conts]


def classify_divergences(model: str, dtype: str, results: dict, runs: list[dict]) -> None:
    """Adds `verdicts` ({exact, near-tie, mismatch}: counts) and `divergences` (each non-exact verdict) to every
    run's lossless entry that has a divergence; loads the target once, only if there is one."""
    prompts = {r["name"]: r["prompts"] for r in runs}
    ref = results["none"]["runs"]
    todo = [(r, name, ll) for r in results.values() for name, ll in r.get("lossless_vs_none", {}).items()
            if ll["first_divergence"]]
    if not todo:
        return
    target = load_target(model, device="cpu", dtype=dtype)
    for r, name, ll in todo:
        verdicts = [classify(target.model, prompts[name][i], ref[name]["outputs"][i], o)
                    for i, o in r["runs"][name]["outputs"].items()]
        summary = summarize_verdicts(verdicts)
        ll["verdicts"], ll["divergences"] = summary["counts"], summary["divergences"]
