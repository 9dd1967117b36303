"""Where a checkpoint's controller time goes inside real decoding: the engine's t_controller per
cycle, then per-function wall time (observation builders, the numpy nets, the controller hooks),
over one 64-token greedy generation. Functions this checkout lacks are skipped, so the same script
times older commits too (BENCHMARKS.md G1's "before" row ran on f6fe4ac).
Run: .venv/bin/python docs/adhoc/controller_breakdown.py data/policies/ltd-wide2 [DTYPE]
(DTYPE: float32 by default; bfloat16 times the hooks on the bf16 engine's tensors, section N3)"""
import sys
import time

import torch

import simulator.observations.paper as obs
from pipeline.decode.engine import Engine
from pipeline.decode.head import load_head_for
from pipeline.decode.target import encode_prompt, load_target

torch.set_num_threads(2)
t = load_target("smollm2-135m", dtype=sys.argv[2] if len(sys.argv) > 2 else "float32")
eng = Engine(t.model, load_head_for("default", t.model), t.eos_token_ids)
ids = encode_prompt(t.tokenizer, "Explain how a hash map works, step by step.")
try:                                     # the layout since simulator/policies/base.py was split by method
    import simulator.policies.ltd as _ltd
    import simulator.policies.radar as _radar
    from online.policy_adapter import PolicyController
    from simulator.policies.checkpoint import load_checkpoint
    from simulator.policies.nets import NumpyMLP, NumpyRadar
    CHOOSERS = [(m, "choose_action") for m in (_ltd, _radar)]
except ImportError:                      # older commits: everything in simulator/policies/base.py
    import simulator.policies.base as P
    PolicyController, load_checkpoint, NumpyMLP, NumpyRadar = P.PolicyController, P.load_checkpoint, P.NumpyMLP, P.NumpyRadar
    CHOOSERS = [(P, "_choose")]
ctrl = PolicyController(load_checkpoint(sys.argv[1]))
eng.generate(ids, 8, controller=ctrl)                      # warm-up
T = {}


def timed(name, f):
    def g(*a, **kw):
        t0 = time.perf_counter()
        r = f(*a, **kw)
        T[name] = T.get(name, 0.0) + time.perf_counter() - t0
        return r
    return g


for name in ("to_numpy", "sort_desc", "ltd_depth_obs", "ltd_size_obs", "level_scores_from_pool", "sort_levels",
             "ltd_depth_obs_one", "ltd_size_obs_parts", "radar_obs", "radar_obs_one"):
    if hasattr(obs, name):
        setattr(obs, name, timed(name, getattr(obs, name)))
try:                                     # the rich observation variant's extra features (section L)
    import simulator.observations.rich as rich
    for name in ("entropy_feature", "ltd_depth_extra", "radar_extra", "with_extra"):
        setattr(rich, name, timed("rich." + name, getattr(rich, name)))
    rich.AcceptanceHistory.features = timed("AcceptanceHistory.features", rich.AcceptanceHistory.features)
except ImportError:
    pass
for cls, meth in ((NumpyMLP, "__call__"), (NumpyMLP, "call_parts"), (NumpyRadar, "__call__")):
    if hasattr(cls, meth):
        setattr(cls, meth, timed(f"{cls.__name__}.{meth}", getattr(cls, meth)))
for mod, fname in CHOOSERS:
    setattr(mod, fname, timed("choose_action", getattr(mod, fname)))
for k in ("plan", "continue_drafting", "verify_size"):
    setattr(ctrl, k, timed("controller." + k, getattr(ctrl, k)))
r = eng.generate(ids, 64, controller=ctrl)
n = len(r.cycles)
print(f"cycles {n}, t_controller {1e3 * sum(c.t_controller for c in r.cycles) / n:.3f} ms/cycle, "
      f"cycle {1e3 * sum(c.t_cycle for c in r.cycles) / n:.1f} ms")
for k, v in sorted(T.items(), key=lambda kv: -kv[1]):
    print(f"{k:32s} {1e3 * v / n:.3f} ms/cycle")
