"""The one EAGLE-3 engine, at every batch size B (docs/design.md, "Serving at batch size B").

    core.py      EAGLE-3 decoding at batch size B: one shape per step, continuous batching (BatchEngine)
    single.py    batch 1 on the same engine: one prompt at a time, and its AR baseline (Engine)
    kv.py        the per-row state: slot caches, token and feature stores, preallocated
    step.py      the fixed-shape parts of a step (pending, draft, verify): what CUDA graphs capture
    rows.py      the host side of a call: inputs checked, queue, which request each slot holds
    admit.py     rows joining and leaving: arrivals, prefills, first tokens, cuts
    prefill.py   prompts prefilled several per forward (the first rows of an AR call)
    verify.py    the verify half of a step: B trees, one target forward, per-row acceptance
    result.py    what a generation returns: per-prompt rows, the step log, the cut rule
"""
