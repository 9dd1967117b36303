"""EAGLE-3 decoding on Hugging Face transformers (docs/design.md, "Vocabulary").

    target.py          load the target LM: a Hugging Face model or the embedded SmolLM2-135M
    attention.py       grouped-query attention under masks without per-head K/V copies (CPU targets)
    arch.py            what a target architecture must offer for exact EAGLE-3 decoding, checked at set-up
    head_model.py      the EAGLE-3 draft head: config and architecture
    head.py            draft heads on disk: load (EAGLE, SpecForge, SGLang, vLLM formats), save, fit checks
    tree.py            draft-tree expansion and selection (EAGLE's topK_genrate), batched over roots
    draft.py           drafting: the head's KV cache and batched tree expansion
    verify.py          the tree-verify forward, greedy and sampling acceptance, KV compaction
    prepare.py         what every engine does to the target and the head first (packed linears, SDPA choice)
    engine.py          the decoding engine (one draft / verify cycle at a time) and its AR baseline;
                       on CUDA it runs on the batched engine at B = 1
    controller.py      the controller hooks policies steer the engines through (batch 1: plan, continue,
                       size, observe; batch B: one StepShape per step)
    batch_engine.py    EAGLE-3 decoding at batch size B: one shape per step, continuous batching
    batch_kv.py        the per-row state of batched decoding: slot caches, token and feature stores
    batch_step.py      the fixed-shape parts of a batched step (pending, draft, verify): what CUDA graphs capture
    batch_rows.py      the host side of a batched call: inputs checked, queue, which request each slot holds
    batch_admit.py     rows joining and leaving the batched engine: arrivals, prefills, first tokens, cuts
    batch_prefill.py   prompts prefilled several per forward (the first rows of an AR call)
    batch_verify.py    the verify half of a batched step: B trees, one target forward, per-row acceptance
    batch_result.py    what a batched generation returns: per-prompt rows, the step log, the cut rule
    lossless.py        lossless at T = 0 for every dtype: exact, near-tie or mismatch
    batch_generate.py  collection's continuations: the batched engine's AR with per-row seeds, an on-disk cache
    generate.py        `draftgym generate`: one prompt with AR or EAGLE-3
    generate_batch.py  `draftgym generate --batch-size B --prompts-file F`: a file of prompts, batched engine
"""
