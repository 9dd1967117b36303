"""Re-SpS: one tree shape held N cycles, trained by PPO with held actions.

    policy.py          the MLP that picks and holds a tree shape (batch 1)
    train.py           `draftgym train --method resps`: PPO with held actions in the replay env
    serving_policy.py  at batch size B: the one shape of the next serving steps (its trainer is
                       simulator/methods/train_load.py's default method)
"""
