"""`python -m tools.gpu_check`: the checks a borrowed GPU is for, in one time budget (docs/gpu.md).

    __main__.py  `python -m tools.gpu_check` = run.py's main
    run.py       the command: steps in order inside the budget, each skipped with its reason
    pytest_step.py  the tests step: `pytest -m gpu` on the device
    latency.py   the latency step: AR, verify, draft and cycle times at batch 1 and B
    kernels.py   the kernels step: where a slow case's device time goes, op by op
    lossless.py  the lossless step: EAGLE-3 against AR on the random-weight target
    profile.py   the profile step: a normal latency profile of the 8B shape on the GPU
    validate.py  the validate step: the shipped head on carried SmolLM2 weights
    serving.py   the serving step: every serving method under one load trace, device beside replay
    report.py    the reports (gpu_report.md for BENCHMARKS.md, gpu_report.json)
    carry.py     large files split into checked parts and joined again (for offline machines)
"""
