"""Latency profiling (docs/design.md, "The latency model").

    profile.py    `draftgym profile`: this device's latency table, measured inside real decoding
    steps.py      latency samples from the engine's own steps, at every batch size B
    timed_ops.py  timed draft and verify operations (warm-up, device sync, median / p10 / p90)
    trust.py      suspect cells: a wild spread, an outlier mean, or out of order in V or B (re-measured, left out, named)
"""
