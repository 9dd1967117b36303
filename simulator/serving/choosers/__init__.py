"""Step choosers: who picks the one shape of a serving step, in replay and on the device.

    base.py               the Chooser interface; static, schedule, the greedy per-step hindsight oracle
    sglang_adaptive.py    SGLang's adaptive EMA rule, reimplemented from its source
    sglang_throughput.py  SGLang's throughput-aware rule, reimplemented from its source
    vllm_adaptive.py      vLLM's adaptive verification (per-request verify budgets), from its source
    sglang_dspark.py      SGLang's DSpark ragged-verify budget, from its source, priced by a DSpark cost table
    nightjar.py           Nightjar's bandit over chain lengths per batch-size bin, from its authors' vLLM fork
    row_budget.py         DraftGym's per-request budget: a learned acceptance model and the slot allocation
    learned.py            a learned load-aware policy as a step chooser (`serve-eval --policy`)
"""
