"""The target's batched verify forward under transformers' `sdpa` (K and V copied to every query
head under a mask: repeat_kv) against `draftgym_sdpa` (pipeline/models/attention.py: SDPA's
enable_gqa on the grouped K/V), interleaved in one run, smollm2-135m, the CPU default dtype unless
given. Median of 5 calls per cell (timed_ops.verify_op without a head: the bare forward over B rows
of V tokens on a cache of c entries per row, the engine's tree mask); log R1.

    .venv/bin/python docs/adhoc/target_gqa_verify.py [DTYPE]
"""
import argparse
import statistics
import time

from pipeline.models import attention
from pipeline.models.target import load_target
from pipeline.profiling.timed_ops import verify_op
from pipeline.runtime.fingerprint import cpu_model


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dtype", nargs="?", default=None, help="default: the CPU's default dtype")
    t = load_target(dtype=ap.parse_args(argv).dtype)
    dt = next(t.model.parameters()).dtype
    print(cpu_model(), dt)
    print(f"{'B':>3} {'c':>5} {'V':>3} {'sdpa ms':>9} {attention.NAME + ' ms':>18} {'ratio':>6}")
    for B, c in [(1, 2048), (4, 512), (16, 256), (16, 2048)]:
        for V in (1, 2, 4, 10):
            runs = {}
            for impl in ("sdpa", attention.NAME):
                t.model.set_attn_implementation(impl if impl == "sdpa" else attention.register())
                runs[impl] = verify_op(t.model, V, c, head=None, batch=B)
                runs[impl]()
            ts = {k: [] for k in runs}
            for _ in range(5):                                   # interleaved: one call of each in turn
                for impl, run in runs.items():
                    t.model.set_attn_implementation(impl)
                    t0 = time.perf_counter()
                    run()
                    ts[impl].append(time.perf_counter() - t0)
            med = {k: statistics.median(v) * 1e3 for k, v in ts.items()}
            print(f"{B:>3} {c:>5} {V:>3} {med['sdpa']:>9.1f} {med[attention.NAME]:>18.1f} "
                  f"{med['sdpa'] / med[attention.NAME]:>6.2f}", flush=True)


if __name__ == "__main__":
    main()
