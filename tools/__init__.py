"""Tools run from a checkout, not installed with the package (pyproject's package list names only
pipeline, simulator and online; tests/test_layout.py checks that no package module imports these).

    gpu_check/   `python -m tools.gpu_check`: what a borrowed GPU checks, in one time budget (docs/gpu.md);
                 `--dry-run` on the CPU prepares and checks everything first
    bench/       `make bench` = `python -m tools.bench`: the benchmarks behind BENCHMARKS.md

The ad-hoc measurement scripts each benchmark log cites live with the logs, in docs/adhoc/.
"""
