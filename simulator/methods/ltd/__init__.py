"""LTD (Learning To Draft): a depth head and a size head, trained by PPO.

    policy.py          the two policies over the draft's confidences (batch 1)
    train.py           `draftgym train --method ltd`: PPO in the replay, then co-adaptation
    serving_policy.py  at batch size B ("ltd-load"): the shared shape of the next serving steps
    serving_train.py   `draftgym train-load --method ltd`: its settings, action set and PPO trainer
"""
