"""DraftGym online: real decoding with a policy in the loop, the `draftgym` CLI, the demo.

    cli.py          the `draftgym` command line (subcommands registered by each package)
    demo.py         `make demo`: the whole loop on the embedded default
    policy_cost.py  `draftgym profile-policy`: what one call of a policy costs inside the engine
    adapters/       simulator policies and choosers as the engine's controllers; `--policy` specs
    validate/       `draftgym validate`: speedups, lossless, sim-vs-real on the real device, at batch 1,
                    at each batch size and under a load trace
    vllm/           `draftgym vllm-run`: DraftGym's heads and schedules in the real vLLM engine

The GPU check and the benchmarks are tools, not part of the package: tools/ beside it.
"""
