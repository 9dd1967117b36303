"""What every stage shares about the machine it runs on.

    clock.py        DeviceClock: clock reads that wait for asynchronous devices
    cpu_linear.py   the CPU matmul backend: oneDNN linears with weights packed once
    fingerprint.py  the environment fingerprint recorded next to every output
    cache.py        the user cache folder (cache_dir(), $DRAFTGYM_CACHE)
    atomic.py       atomic file writes: readers see the old file or the new one, never half of one
"""
