"""Trainers (`draftgym train --method ltd | radar | resps`), all in the replay simulator.

    common.py  what the trainers share: settings (PolicyTrainConfig), train / val logs and latency, output
    ppo.py     a small CleanRL-style PPO for the numpy envs
    ltd.py     LTD: depth and size policies by PPO, co-adapted Iter0-Iter3
    radar.py   RADAR: the LSTM policy by REINFORCE
    resps.py   Re-SpS: the shape policy by PPO with held actions
    run.py     run_trainer: `draftgym train`'s one entry for the three methods
"""
