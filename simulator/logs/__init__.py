"""Logs for the simulator.

    read.py         checked reads of the sequences and positions tables of one (model, temperature, dtype)
    replay_logs.py  those rows assembled into flat numpy arrays for replay (ReplayLogs, load_logs)
    stream.py       logs larger than memory: chunked reads and sampled windows (LogSource)
    ray_chunks.py   chunks of a LogSource as Ray tasks (`evaluate --ray`, one box or a cluster)
    synthetic.py    synthetic logs with the real Parquet schemas, for tests and demos (`draftgym synth-logs`)
"""
