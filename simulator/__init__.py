"""DraftGym simulator: exact replay of logged EAGLE-3 decoding on a CPU, RL policies, baselines.

docs/design.md has the replay ("Exact counterfactual replay"), the methods ("Action spaces") and
the baselines ("Baselines and the oracle"); docs/policies.md shows how to train and check policies.

    logs/              the collected logs as numpy arrays for replay; synthetic logs
    envs/              vectorised RL environments over the replay (LTD depth and size, Re-SpS, RADAR)
    observations/      policy inputs, built by one code path offline and online (paper, rich)
    policies/          the Policy interface, LTD / RADAR / Re-SpS policies, networks, checkpoints
    train/             the trainers (`draftgym train`): PPO, LTD, RADAR, Re-SpS
    serving/           batch size B: continuous-batching replay, per-B schedules, a learned load-aware
                       policy, the engines' formats (`draftgym tune`, `serve-eval`, `export`,
                       `profile-import`, `train-load`; docs/serving.md)
    replay.py          replay whole generations under any policy, the engine's hooks batched
    latency_model.py   per-op times from the `latency` table: interpolation, noise, RADAR's T_gen
    latency_surface.py interpolation of measured op times over (W or V, context length); noise
    latency_diagnostics.py  the latency model's fit (leave-one-out), a workload's coverage, a plot
    latency_batch.py   op times interpolated in the batch size B between profiled batch levels
    latency_report.py  `draftgym latency-report`: the latency model's leave-one-out fit and a plot
    baselines.py       static, grid search, DDD, entropy stop, goodput, random, the hindsight oracle
    policy_specs.py    load_policy: the one registry of `--policy` specs
    evaluate.py        `draftgym evaluate`: policies and baselines replayed per dataset
    transfer.py        `draftgym transfer`: one set of logs, two latency profiles, the 2 x 2 table
    cli.py             the `draftgym` subcommands registered by this package
"""
