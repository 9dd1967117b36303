"""Benchmarks (`make bench` = `python -m tools.bench`; figures in BENCHMARKS.md).

    __main__.py  every benchmark at a small size, one after the other, one summary table
    engine.py    AR against EAGLE-3 trees on MT-bench prompts, plus per-op times
    collect.py   positions logged per second against online EAGLE-3 tokens/s, same prompts, same run
    env.py       vectorised replay-env steps per second
    ltd.py       wall time of an LTD depth-policy PPO run of N env steps
    batch.py     tokens/s against batch size B for AR and static shapes (the batched engine)
    scale.py     logs of N positions: writing, disk per position, streamed evaluate, LTD PPO
    fidelity.py  the replay's decode tokens/s against real decoding, per method, fp32 and bf16
"""
