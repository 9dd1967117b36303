"""What every policy shares: the engine's controller hooks batched over many generations, and the networks.

    base.py  the Policy interface and its batched hook inputs (PlanBatch, StepBatch, PoolBatch)
    nets.py  the networks (MLP, RADAR's LSTM) and their numpy batch-1 forwards

The methods themselves (LTD, RADAR, Re-SpS) are in simulator/methods/.
"""
