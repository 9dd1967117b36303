"""Vectorised RL environments over the exact replay (docs/design.md, "Action spaces").

    core.py    EnvConfig, Re-SpS's shape sets, the replay core every mode shares, reward objectives
    vector.py  the modes (LTD depth, LTD size, Re-SpS shape, RADAR) and a gymnasium wrapper
"""
