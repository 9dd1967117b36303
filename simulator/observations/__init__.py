"""Policy inputs: the one place they are built, for the replay env, replay and the engine alike.

    paper.py  each paper's own observations (LTD depth and size, RADAR, Re-SpS), batched and batch-1
    rich.py   the "rich" variant: the paper's plus the best beam's entropy and the acceptance history
"""
