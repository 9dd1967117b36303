"""Policies: the engine's controller hooks, batched over many generations.

    base.py        the Policy interface and its batched hook inputs (PlanBatch, StepBatch, PoolBatch)
    ltd.py         LTD's depth and size policies
    radar.py       RADAR's LSTM stop / continue policy
    resps.py       Re-SpS's held tree-shape policy
    resps_load.py  the load-aware serving policy: one shared shape per step at batch size B, held N steps
    ltd_load.py    LTD at batch size B: a depth head and a size head pick a serving step's shape (train-load --method ltd)
    radar_load.py  RADAR at batch size B: stop / continue per depth level picks its depth (train-load --method radar)
    nets.py        the networks (MLP, RADAR's LSTM) and their numpy batch-1 forwards
    checkpoint.py  the checkpoint format (manifest.json + state_dicts), save and load
"""
