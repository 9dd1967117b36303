"""A checkpoint's controller hooks inside real decoding: the engine's t_controller per cycle, each hook's
(plan, continue_drafting, verify_size, observe) ms per cycle over one 48-token greedy generation, then
cProfile of the hooks over another (log E2, F: LTD's size call 0.53 -> 0.26 ms per cycle).

    .venv/bin/python docs/adhoc/controller_profile.py [POLICY_DIR]     (default data/policies/ltd-cpu)
"""
import argparse
import cProfile
import io
import pstats
import time

import torch

from online.adapters.policy import PolicyController
from pipeline.decode.engine.single import Engine
from pipeline.models.head import load_head_for
from pipeline.models.target import encode_prompt, load_target
from simulator.methods.checkpoint import load_checkpoint

HOOKS = ("plan", "continue_drafting", "verify_size", "observe")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("policy_dir", nargs="?", default="data/policies/ltd-cpu")
    a = ap.parse_args(argv)
    torch.set_num_threads(2)   # as validate runs (section E2 used 1)
    t = load_target("smollm2-135m")
    eng = Engine(t.model, load_head_for("default", t.model), t.eos_token_ids)
    ids = encode_prompt(t.tokenizer, "Explain how a hash map works, step by step.")
    ctrl = PolicyController(load_checkpoint(a.policy_dir))
    eng.generate(ids, 8, controller=ctrl)
    orig = {k: getattr(ctrl, k) for k in HOOKS}
    tot, cnt = {k: 0.0 for k in orig}, {k: 0 for k in orig}

    def wrap(k, f):
        def g(*args, **kw):
            t0 = time.perf_counter()
            r = f(*args, **kw)
            tot[k] += time.perf_counter() - t0
            cnt[k] += 1
            return r
        return g

    for k, f in orig.items():
        setattr(ctrl, k, wrap(k, f))
    r = eng.generate(ids, 48, controller=ctrl)
    n = len(r.cycles)
    print("cycles", n, "t_controller/cycle ms", 1e3 * sum(c.t_controller for c in r.cycles) / n)
    for k in tot:
        print(k, cnt[k], "calls", round(1e3 * tot[k] / n, 3), "ms/cycle")
    pr = cProfile.Profile()

    def prof(f):
        def g(*args, **kw):
            pr.enable()
            r = f(*args, **kw)
            pr.disable()
            return r
        return g

    for k, f in orig.items():
        setattr(ctrl, k, prof(f))
    eng.generate(ids, 48, controller=ctrl)
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(18)
    print(s.getvalue()[:5000])


if __name__ == "__main__":
    main()
