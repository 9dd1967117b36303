"""`draftgym validate`: methods decoded on the real device, timed, checked lossless, and compared with
the replay's prediction.

    common.py        what every mode shares: ValidateConfig, the three modes' configs (Batch1Config,
                     BatchSizesConfig, LoadTraceConfig) and which one a command is, the checks,
                     prompt sets, acceptance logs
    speedbench.py    the one decoding driver at every B (run_calls): Spec-Bench-style timing, the lossless check
    batch1.py        `draftgym validate`: per-prompt speedups, lossless, sim-vs-real at batch 1
    report.py        its Markdown + PNG report
    sim_vs_real.py   replayed predictions against the measured cycles
    reanchor.py      re-anchored sim-vs-real: each method replayed on the text it decoded
    batch.py         `validate --batch-sizes`: every method at every batch size B
    batch_report.py  its Markdown report and tokens/s-against-B plot
    interleave.py    `validate --batch-sizes --profile-interleave`: a time-local profile at each B
    load.py          `validate --load-trace`: an arrival trace served on the device and in replay
"""
