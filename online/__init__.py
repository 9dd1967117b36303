"""DraftGym online: real decoding with a policy in the loop, the `draftgym` CLI, the demo, benchmarks.

    cli.py                    the `draftgym` command line (subcommands registered by each package)
    controller_specs.py       a `--policy` spec as a controller for the real engine
    policy_adapter.py         a simulator Policy inside the engine's controller hooks (batch 1)
    policy_cost.py            `draftgym profile-policy`: what one call of a policy costs inside the engine
    speedbench.py             the one decoding driver of validate at every B (run_calls), Spec-Bench-style timing, the lossless check
    validate.py               `draftgym validate`: speedups, lossless, sim-vs-real on the real device
    validate_report.py        validate's Markdown + PNG report
    sim_vs_real.py            validate's sim-vs-real: replayed predictions against the measured cycles
    reanchor.py               validate's re-anchored sim-vs-real: each method replayed on the text it decoded
    validate_batch.py         `draftgym validate --batch-sizes`: every method at every batch size B
    validate_batch_report.py  its Markdown report and tokens/s-against-B plot
    validate_load.py          `draftgym validate --load-trace`: an arrival trace served on the device and in replay
    chooser_adapter.py        a simulator step chooser steering the batched engine (the same object on both sides)
    demo.py                   `make demo`: the whole loop on the embedded default
    gpu_check.py              `python -m online.gpu_check`: what a borrowed GPU checks, in one time budget
    gpu_latency.py            the GPU check's latency step: AR, verify, draft and cycle times at batch 1 and B
    gpu_profile.py            the GPU check's profile step: a normal latency profile of the 8B shape on the GPU
    gpu_validate.py           the GPU check's validate step: the shipped head on carried SmolLM2 weights
    gpu_report.py             the GPU check's reports (gpu_report.md for BENCHMARKS.md, gpu_report.json)
    carry.py                  large files split into checked parts and joined again (for offline machines)
    bench/                    the benchmarks behind BENCHMARKS.md (`make bench`)
"""
