"""EAGLE-3 decoding on Hugging Face transformers (docs/design.md, "Vocabulary").

    tree.py            draft-tree expansion and selection (EAGLE's topK_genrate), batched over roots
    draft.py           drafting: the head's KV cache and batched tree expansion
    verify.py          the tree-verify forward, greedy and sampling acceptance, KV compaction
    step_shape.py      the step shape (D, W, V): StepShape, the pool size, parsing, labels; every layer's one home
    controller.py      the controller hooks policies steer the engine through (batch 1: plan, continue,
                       size, observe; batch B: one StepShape per step)
    engine/            the one engine, at every batch size: one shape per step, continuous batching
                       (core.py), and batch 1 on it, one prompt at a time with its AR baseline (single.py)
    lossless.py        lossless at T = 0 for every dtype: exact, near-tie or mismatch
    continuations.py   collection's target continuations: the engine's AR with per-row seeds, an on-disk cache
    generate.py        `draftgym generate`: one prompt with AR or EAGLE-3
    generate_file.py   `draftgym generate --batch-size B --prompts-file F`: a file of prompts, one engine

The models the engine runs (target, head, attention, architecture checks) are in pipeline/models/.
"""
