"""DraftGym simulator: exact replay of logged EAGLE-3 decoding on a CPU.

    logs.py          load positions + sequences into numpy arrays (checked reads)
    latency.py       latency model from the `latency` table (interpolation, noise, RADAR constants)
    observations.py  the one place policy observations are built (offline and online)
    replay.py        replay whole generations under any policy (the Controller hooks, batched)
    env.py           vectorised RL envs: depth (LTD), size (LTD), shape (Re-SpS), radar; gymnasium wrapper
    policy.py        Policy protocol, learned policies, checkpoints (manifest.json) and the loader
    baselines.py     static, grid search, DDD, entropy stop, goodput, random, oracle (DP)
    evaluate.py      `draftgym evaluate`
    ppo.py, train_*.py   PPO / REINFORCE trainers (`draftgym train`)
    synthetic.py     synthetic logs with the real schemas (tests, demos)
"""
