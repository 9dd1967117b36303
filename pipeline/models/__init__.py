"""The models an engine runs: the target LM and the EAGLE-3 draft head, loaded, checked and prepared.

    target.py      load the target LM: a Hugging Face model or the embedded SmolLM2-135M
    attention.py   grouped-query attention under masks without per-head K/V copies (CPU targets)
    arch.py        what a target architecture must offer for exact EAGLE-3 decoding, checked at set-up
    head_model.py  the EAGLE-3 draft head: config and architecture
    rope.py        the head's rotary position embedding (plain, linear, dynamic, llama3, yarn)
    head.py        draft heads on disk: load (EAGLE, SpecForge, SGLang, vLLM formats), save, fit checks, head-convert
    prepare.py     what every engine does to the target and the head first (packed linears, SDPA choice)
"""
