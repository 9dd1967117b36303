import cProfile, pstats, torch, time
from pipeline.decode.target import load_target, encode_prompt
from pipeline.decode.head import load_head_for
from pipeline.decode.engine import Engine
from online.policy_adapter import PolicyController
from simulator.policies.checkpoint import load_checkpoint
import sys
torch.set_num_threads(2)   # as validate runs (section E2 used 1)
t = load_target("smollm2-135m"); head = load_head_for("default", t.model)
eng = Engine(t.model, head, t.eos_token_ids)
ids = encode_prompt(t.tokenizer, "Explain how a hash map works, step by step.")
ctrl = PolicyController(load_checkpoint(sys.argv[1] if len(sys.argv) > 1 else "data/policies/ltd-cpu"))
eng.generate(ids, 8, controller=ctrl)
orig = {k: getattr(ctrl, k) for k in ("plan", "continue_drafting", "verify_size", "observe")}
tot = {k: 0.0 for k in orig}; cnt = {k: 0 for k in orig}
def wrap(k, f):
    def g(*a, **kw):
        t0 = time.perf_counter(); r = f(*a, **kw); tot[k] += time.perf_counter() - t0; cnt[k] += 1; return r
    return g
for k, f in orig.items(): setattr(ctrl, k, wrap(k, f))
r = eng.generate(ids, 48, controller=ctrl)
n = len(r.cycles)
print("cycles", n, "t_controller/cycle ms", 1e3 * sum(c.t_controller for c in r.cycles) / n)
for k in tot: print(k, cnt[k], "calls", round(1e3 * tot[k] / n, 3), "ms/cycle")
import cProfile, pstats, io
pr = cProfile.Profile()
def prof(k, f):
    def g(*a, **kw):
        pr.enable(); r = f(*a, **kw); pr.disable(); return r
    return g
for k, f in orig.items(): setattr(ctrl, k, prof(k, f))
eng.generate(ids, 48, controller=ctrl)
s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(18); print(s.getvalue()[:5000])
