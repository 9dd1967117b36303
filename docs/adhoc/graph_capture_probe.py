"""Can the batched engine's step parts be captured as CUDA graphs here, and under which
capture_error_mode? (issue N; run on a GPU machine, one process per mode: a failed capture can
leave torch's CUDA generator in capture mode for the rest of the process.)

    python docs/adhoc/graph_capture_probe.py [llama-3.1-8b|tiny]

Per mode it prints the graph cache's summary (captures, failure and its traceback's end) after a
batch-1 AR call and an EAGLE-3 (8, 10, 60) call on the random-weight target, and first whether a
plain HF forward (no cache) captures at all. Exit code 0 when some mode captured everything.
"""
import argparse
import json
import os
import subprocess
import sys
import traceback

import torch

MODES = ("global", "thread_local", "relaxed")


def one(target: str) -> dict:
    from tools.gpu_check.run import CheckConfig, build_head, build_target
    from pipeline.decode.engine.core import BatchEngine
    from pipeline.decode.controller import StaticController
    from pipeline.decode.step_shape import StepShape

    cfg = CheckConfig(out="/tmp/probe", target=target, dtype="bfloat16")
    model = build_target(cfg)
    head = build_head(cfg, model)
    out = {"mode": os.environ.get("DRAFTGYM_CAPTURE_MODE", "global")}
    x = torch.randint(0, 1000, (1, 16), device="cuda")
    try:                                             # a plain forward, outside the engine
        model(input_ids=x, use_cache=False)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, capture_error_mode=out["mode"]):
            model(input_ids=x, use_cache=False)
        out["plain_forward"] = "captured"
    except Exception:
        out["plain_forward"] = traceback.format_exc()[-1500:]
        return out
    p = torch.randint(0, 1000, (128,)).tolist()
    eng = BatchEngine(model, head)
    eng.generate_ar([p], 6, batch_size=1)
    eng.generate_ar([p], 6, batch_size=1)
    out["ar"] = eng.graphs.summary()
    if eng.graphs.enabled:
        def ctrl():
            return StaticController(StepShape(8, 10, 60))
        eng.generate([p, p], 6, batch_size=2, controller=ctrl())
        eng.generate([p, p], 6, batch_size=2, controller=ctrl())
        out["eagle3"] = eng.graphs.summary()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("target", nargs="?", default="llama-3.1-8b")
    target = ap.parse_args(argv).target
    if os.environ.get("PROBE_CHILD"):
        print("PROBE " + json.dumps(one(target)), flush=True)
        return 0
    ok = None
    for mode in MODES:
        env = dict(os.environ, PROBE_CHILD="1", DRAFTGYM_CAPTURE_MODE=mode)
        r = subprocess.run([sys.executable, __file__, target], env=env, capture_output=True, text=True)
        line = next((ln for ln in r.stdout.splitlines() if ln.startswith("PROBE ")), None)
        res = json.loads(line[6:]) if line else {"mode": mode, "error": (r.stderr or "")[-1500:]}
        print(json.dumps(res, indent=1), flush=True)
        if ok is None and (res.get("eagle3") or {}).get("failure", "x") is None:
            ok = mode
            break
    print(f"PROBE_OK_MODE={ok}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
