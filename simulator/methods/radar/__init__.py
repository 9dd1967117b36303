"""RADAR: stop / continue per depth level, trained by REINFORCE with a baseline.

    policy.py          the LSTM stop / continue policy over the beam confidences (batch 1)
    train.py           `draftgym train --method radar`: REINFORCE on logged acceptance
    serving_policy.py  at batch size B ("radar-load"): the shared depth of the next serving steps
    serving_train.py   `draftgym train-load --method radar`: its settings, action set and trainer
"""
