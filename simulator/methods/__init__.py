"""The learned methods, one folder each: the policy, its batch-1 trainer and its load-aware variant
next to each other (docs/policies.md; docs/serving.md, "Learned load-aware policies").

    ltd/            LTD: a depth and a size head (PPO, co-adapted Iter0-Iter3); at batch B the same two heads
    radar/          RADAR: stop / continue per depth level (REINFORCE with a baseline), at batch 1 and B
    resps/          Re-SpS: one tree shape held N cycles (PPO with held actions); at batch B one shared shape
    run.py          `draftgym train --method ltd | radar | resps`: the one entry for the three trainers
    train_load.py   `draftgym train-load`: the load-aware variants in the serving replay
    checkpoint.py   the checkpoint format (manifest.json + state_dicts), save and load

Each method folder: policy.py (batch 1), train.py (its trainer), serving_policy.py and serving_train.py
(batch B; Re-SpS's is trained by train_load.py's PPO over a shape list).
"""
