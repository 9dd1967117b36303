"""Simulator decision makers as the engine's controllers (pipeline/decode/controller.py).

    policy.py   a simulator Policy inside the engine's controller hooks (batch 1, per sequence)
    chooser.py  a simulator step chooser steering the engine at batch B (the same object on both sides)
    specs.py    a `--policy` spec as a controller for the real engine
"""
