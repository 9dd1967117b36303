"""DraftGym's answers in the real vLLM engine (`draftgym vllm-run`; docs/vllm.md).

    env.py       where vLLM lives (`make vllm`: .venv-vllm) and what it is handed: target and head directories
    worker.py    the vLLM side: one engine driven step by step (runs in vLLM's environment, imports no DraftGym)
    run.py       `draftgym vllm-run`: configs, closed batches and load runs, checks, report, vLLM's cost curve
    checks.py    lossless against no speculation (bf16: near-tie or mismatch) and against DraftGym's AR
    compare.py   the replay against vLLM: its counters and, on vLLM's own step costs, its tokens/s
"""
