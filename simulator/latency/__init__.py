"""The latency model: the replay's clock, from a measured `latency` table.

    model.py        per-op times from the `latency` table: interpolation, noise, RADAR's T_gen
    estimate.py     which number of a profile cell the model prices (its `point`: mean, median, ...)
    surface.py      interpolation of measured op times over (W or V, context length); noise
    batch.py        a profile's batch levels, and op times interpolated in B between them
    diagnostics.py  the model's fit (leave-one-out), a workload's coverage, a plot
    report.py       `draftgym latency-report`: the leave-one-out fit and a plot
"""
