"""What every stage shares about the machine it runs on.

    clock.py        DeviceClock: clock reads that wait for asynchronous devices
    cpu_linear.py   the CPU matmul backend: oneDNN linears with weights packed once
    attention_backends.py  the SDPA kernels every forward runs on (flash > efficient > math, no cuDNN)
    host_reads.py   counts reads of tensor values on the host (each a device sync on a GPU)
    bandwidth.py    the weight-read bound: weight bytes / the GPU's datasheet memory bandwidth
    cuda_graphs.py  CUDA graphs of fixed-shape step parts: captured per key, replayed
    env.py          on/off switches read from the environment (one-line errors for other values)
    fingerprint.py  the environment fingerprint recorded next to every output
    cache.py        the user cache folder (cache_dir(), $DRAFTGYM_CACHE)
    atomic.py       atomic file writes: readers see the old file or the new one, never half of one
"""
