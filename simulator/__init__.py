"""DraftGym simulator: exact replay of logged EAGLE-3 decoding on a CPU, RL policies, baselines.

docs/design.md has the replay ("Exact counterfactual replay"), the methods ("Action spaces") and
the baselines ("Baselines and the oracle"); docs/policies.md shows how to train and check policies.

    logs/              the collected logs as numpy arrays for replay; synthetic logs
    latency/           the latency model: per-op times from the `latency` table, over B, its fit
    envs/              vectorised RL environments over the replay (LTD depth and size, Re-SpS, RADAR)
    observations/      policy inputs, built by one code path offline and online (paper, rich)
    policies/          the Policy interface and the networks every method uses
    train/             what every trainer shares: settings, data, the one PPO update
    methods/           LTD, RADAR and Re-SpS, each in one folder: policy, trainer, load-aware variant;
                       checkpoints; `draftgym train` and `train-load`
    serving/           batch size B: continuous-batching replay, per-B schedules, step choosers,
                       the engines' formats (`draftgym tune`, `serve-eval`, `export`, `profile-import`;
                       docs/serving.md)
    replay.py          replay whole generations under any policy, the engine's hooks batched
    baselines.py       static, grid search, DDD, entropy stop, goodput, random, the hindsight oracle
    policy_specs.py    load_policy: the one registry of `--policy` specs
    evaluate.py        `draftgym evaluate`: policies and baselines replayed per dataset
    serve_eval.py      `draftgym serve-eval`: every way of choosing the step's shape under one load
    transfer.py        `draftgym transfer`: one set of logs, two latency profiles, the 2 x 2 table
    cli.py             the `draftgym` subcommands registered by this package
    serving_cli.py     the flags of its serving commands (tune, serve-eval, train-load, export, profile-import)
"""
