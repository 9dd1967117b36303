"""Logs for the simulator.

    read.py       checked reads of the sequences and positions tables of one (model, temperature, dtype)
    load.py       those rows assembled into flat numpy arrays for replay (ReplayLogs, load_logs)
    synthetic.py  synthetic logs with the real Parquet schemas, for tests and demos (`draftgym synth-logs`)
"""
