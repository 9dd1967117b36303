"""A learned load-aware policy against the per-B schedule, AR and the greedy oracle (docs/serving.md,
"Learned load-aware policies"; log R). Replay figures, deterministic; no timing.

1. Tokens/s per arrival rate on the test split: 96 Poisson requests at each rate that keeps about
   B = 1, 2, 4, 8, 16, 32 rows busy under AR, at most 16 rows; the schedule tuned on val.
2. Headroom per decision in the load-aware env (test split, the first policy's hold): for 32 servers
   x 24 decisions, the reward (held throughput x AR) of every action, replayed from a copy of the
   state; the means of the schedule's action, the policy's, the in-sample best per B, per (B,
   quartile of the depth-1 confidence) and the per-decision hindsight best.

    .venv/bin/draftgym synth-logs --out /tmp/sl --n-sequences 40 --widths 1,10 --latency-profile gpu \
        --latency-batches 1,2,4,8,16
    .venv/bin/draftgym train-load --logs /tmp/sl --out /tmp/sl-policy
    .venv/bin/python docs/adhoc/serving_load_policy.py /tmp/sl /tmp/sl-policy [MORE_POLICY_DIRS]
"""
import argparse
import copy
import json

import numpy as np

from pipeline.decode import step_shape
from simulator.policy_specs import load_policy
from simulator.serve_eval import learned_choosers
from simulator.serving import arrivals as arr, metrics
from simulator.serving.choosers.base import GreedyOracle, ScheduleChooser, StaticChooser
from simulator.serving.env import LoadEnv, LoadEnvConfig
from simulator.serving.inputs import candidates, load_inputs
from simulator.serving.load import serve
from simulator.serving.replay import ShapeTable
from simulator.serving.schedule import Schedule
from simulator.serving.tune import TuneConfig, tune

M, TB = 16, (1, 2, 4, 8, 16, 32)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("logs")
    ap.add_argument("policies", nargs="+", help="`draftgym train-load` output directories")
    a = ap.parse_args(argv)
    root, pols = a.logs, a.policies
    test, lat = load_inputs(TuneConfig(logs=root), "test")
    val, _ = load_inputs(TuneConfig(logs=root), "val")
    cands = candidates(val, "all")
    sched = tune(val, lat, (1, 2, 4, 8, 16), cands)["schedule"]
    print("schedule (tuned on val):", sched.table())
    rates = arr.rates_for_logs(TB, test, lat)
    rows = {}
    for r in rates:
        t = arr.poisson(r, 96, seed=0)
        methods = ([StaticChooser(step_shape.OFF, "AR"), ScheduleChooser(sched, "schedule")] + learned_choosers(pols, test, M)
                   + [GreedyOracle()])
        table = ShapeTable(test, list(dict.fromkeys([*cands, *sched.shapes(), *(s for m in methods for s in m.shapes())])))
        for m in methods:
            rows.setdefault(m.name, []).append(metrics.summarize(serve(test, lat, table, m, t, M))["tokens_per_s"])
    print(f"{'tokens/s at rate (B under AR)':<40}" + "".join(f"{r:>7.2f} ({b:>2})" for r, b in zip(rates, TB)))
    for name, v in rows.items():
        print(f"{name[:40]:<40}" + "".join(f"{x:>12.1f}" for x in v))
    for name, v in rows.items():
        print(f"{(name + ' / schedule')[:40]:<40}" + "".join(f"{x / y:>12.3f}" for x, y in zip(v, rows["schedule"])))

    # 2. headroom per decision, with the first policy
    pol = load_policy(pols[0])
    shapes = [step_shape.parse(s) for s in pol.shapes]
    with open(f"{pols[0]}/training.json") as f:
        train_sched = Schedule([(lo, hi, step_shape.parse(s)) for lo, hi, s in json.load(f)["schedule_on_train"]])
    env = LoadEnv(test, lat, shapes, LoadEnvConfig(n_envs=32, max_batch=M, hold=pol.hold, target_batches=TB,
                                                   confidence_depth=pol.obs_spec["confidence_depth"], seed=5))
    o, _ = env.reset(seed=5)
    R, Bs, conf, learned, sch = [], [], [], [], []
    for _ in range(24):
        r_all = np.zeros((env.n, len(shapes)))
        for act in range(len(shapes)):
            r_all[:, act] = copy.deepcopy(env).step(np.full(env.n, act))[1]
        B = env.active.sum(1)
        R.append(r_all)
        Bs.append(B)
        conf.append(o[:, 7] if o.shape[1] > 7 else np.zeros(env.n))
        learned.append(pol.act(o))
        sch.append(np.array([shapes.index(train_sched.shape_for(int(b))) for b in B]))
        o, *_ = env.step(learned[-1])
    R, Bs, conf, learned, sch = map(np.concatenate, (R, Bs, conf, learned, sch))
    idx = np.arange(len(R))

    def best_table(keys):
        out = np.zeros(len(R), int)
        for k in np.unique(keys):
            out[keys == k] = R[keys == k].mean(0).argmax()
        return out

    bins = np.digitize(conf, np.quantile(conf, [0.25, 0.5, 0.75]))
    cols = {"schedule": sch, "policy": learned, "best per B": best_table(Bs), "best per (B, conf)": best_table(Bs * 10 + bins)}
    print(f"\nreward x AR per decision ({len(R)} decisions, {pol.name}): " + ", ".join(
        f"{k} {R[idx, v].mean():.4f}" for k, v in cols.items()) + f", hindsight best {R.max(1).mean():.4f}")
    for lo, hi in ((1, 1), (2, 3), (4, 7), (8, M)):
        m = (Bs >= lo) & (Bs <= hi)
        print(f"  B {lo}-{hi} ({m.sum()} decisions): " + ", ".join(f"{k} {R[idx[m], v[m]].mean():.4f}" for k, v in cols.items())
              + f", hindsight best {R[m].max(1).mean():.4f}")


if __name__ == "__main__":
    main()
