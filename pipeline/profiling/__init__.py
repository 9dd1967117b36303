"""Latency profiling (docs/design.md, "The latency model").

    profile.py    `draftgym profile`: this device's latency table, measured inside real decoding
    batched.py    latency rows at batch size B > 1 (`draftgym profile --batch-sizes`)
    timed_ops.py  timed draft and verify operations (warm-up, device sync, median / p10 / p90)
    trust.py      suspect cells: a wild spread or out of order in V or B (re-measured, left out, named)
"""
