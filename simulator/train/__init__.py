"""What every trainer shares (the trainers themselves are in simulator/methods/).

    common.py  settings (PolicyTrainConfig), train / val logs and latency, output
    ppo.py     a small CleanRL-style PPO for the numpy envs: the one clipped-surrogate update
"""
