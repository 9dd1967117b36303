"""The vLLM side of `draftgym vllm-run`: one engine, one speculation config, driven step by step.

Runs in the vLLM environment (`make vllm`: .venv-vllm, vLLM's own torch and transformers), not in
DraftGym's: it imports vLLM and the standard library only, never `pipeline`, `simulator` or `online`.
`online/vllm/run.py` starts it as

    .venv-vllm/bin/python online/vllm/worker.py JOB.json RESULTS.jsonl

JOB.json (written by run.py):

    model, dtype, seed, max_model_len, max_num_seqs, memory_fraction (of the node's memory; the KV cache's
    size is VLLM_CPU_KVCACHE_SPACE, set by run.py)
    speculative_config   null (no speculation) or vLLM's own dict (method eagle3, model, k or a schedule)
    warmup               [token-id prompts] decoded once, untimed, before the first run (the engine
                         compiles and allocates there, not inside a timed run)
    runs                 [{name, kind: closed | trace, prompts: [[token ids]], max_tokens,
                           batch (closed: B requests in flight, a finished one's slot takes the next),
                           arrivals (trace: seconds from the run's start, one per prompt)}]

RESULTS.jsonl, one JSON object a line, flushed as it is written (an engine that dies mid-run leaves
every finished request and run on disk):

    {"event": "ready", "startup_s", "vllm_version", "torch_version"}
    {"event": "request", "run", "index", "output_ids", "arrival_s", "first_token_s", "finish_s"}
    {"event": "run", "run", "wall_s", "steps": [[in_flight, seconds, prefill, tokens], ...], "spec": counters}
    {"event": "done"}

Why the offline engine in a subprocess, not `vllm serve` over HTTP: a step-by-step loop over
`LLMEngine.step()` sets the batch exactly (B requests in flight, refilled), times each engine step
(the cost curve needs a step time per (B, k), which the server does not report), and adds no HTTP,
detokenisation or client jitter to a 2-core box; arrivals are replayed by the same loop. The engine
core runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0, set by run.py), so a step's wall time is
the engine's step, not an inter-process poll.

Speculation counters (per run, the difference of vLLM's own Prometheus counters before and after):
num_drafts, num_draft_tokens, num_accepted_tokens, num_accepted_tokens_per_pos; vLLM's mean acceptance
length is 1 + num_accepted_tokens / num_drafts.
"""
from __future__ import annotations

import json
import sys
import time

SPEC_COUNTERS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
                 "vllm:spec_decode_num_accepted_tokens", "vllm:spec_decode_num_accepted_tokens_per_pos")


def spec_counters(llm) -> dict:
    """vLLM's speculation counters now: {short name: int or [int per position]}."""
    out = {}
    for m in llm.get_metrics():
        if m.name in SPEC_COUNTERS:
            key = m.name.removeprefix("vllm:spec_decode_")
            out[key] = list(getattr(m, "values", None) or []) if key.endswith("per_pos") else int(m.value)
    return out


def counter_delta(after: dict, before: dict) -> dict:
    d = {}
    for k, v in after.items():
        b = before.get(k, [] if isinstance(v, list) else 0)
        d[k] = [x - (b[i] if i < len(b) else 0) for i, x in enumerate(v)] if isinstance(v, list) else v - b
    return d


class Writer:
    def __init__(self, path: str):
        self.f = open(path, "a", buffering=1)

    def __call__(self, event: str, **kw) -> None:
        self.f.write(json.dumps({"event": event, **kw}) + "\n")
        self.f.flush()


def drive(engine, params, run: dict, emit) -> list:
    """One run through the engine: closed batch (`batch` in flight) or a trace (`arrivals`).

    Returns the steps [[in_flight, seconds, prefill, tokens], ...]: in_flight = requests in the engine when the
    step began, prefill = a request joined since the step before (its prompt is processed in this one),
    tokens = output tokens the step emitted over all requests."""
    prompts, name = run["prompts"], run["name"]
    arrivals = run.get("arrivals") or [0.0] * len(prompts)
    order = sorted(range(len(prompts)), key=lambda i: arrivals[i])
    nxt, live, steps = 0, {}, []
    first, seen = {}, {}
    joined = False
    t0 = time.perf_counter()
    while nxt < len(order) or live:
        now = time.perf_counter() - t0
        while nxt < len(order):                                    # admit what may join now
            i = order[nxt]
            if run["kind"] == "closed" and len(live) >= run["batch"]:
                break
            if run["kind"] == "trace" and arrivals[i] > now:
                break
            rid = f"{name}-{i}"
            engine.add_request(rid, {"prompt_token_ids": prompts[i]}, params)
            live[rid] = (i, arrivals[i] if run["kind"] == "trace" else now)
            nxt, joined = nxt + 1, True
        if not live:                                               # idle until the next arrival
            time.sleep(max(0.0, arrivals[order[nxt]] - (time.perf_counter() - t0)))
            continue
        n, prefill = len(live), joined
        ts = time.perf_counter()
        outs = engine.step()
        te = time.perf_counter()
        joined, emitted = False, 0
        for o in outs:
            i, arr = live[o.request_id]
            got = len(o.outputs[0].token_ids) if o.outputs else 0
            emitted += got - seen.get(o.request_id, 0)
            seen[o.request_id] = got
            if o.outputs and o.outputs[0].token_ids and o.request_id not in first:
                first[o.request_id] = te - t0
            if o.finished:
                del live[o.request_id]
                emit("request", run=name, index=i, output_ids=list(o.outputs[0].token_ids), arrival_s=arr,
                     first_token_s=first.get(o.request_id, te - t0), finish_s=te - t0)
        steps.append([n, te - ts, prefill, emitted])
    return steps


def main(job_path: str, out_path: str) -> int:
    job = json.load(open(job_path))
    emit = Writer(out_path)
    t0 = time.perf_counter()
    import torch
    import vllm
    from vllm import LLM, SamplingParams

    llm = LLM(model=job["model"], dtype=job["dtype"], seed=job["seed"], max_model_len=job["max_model_len"],
              max_num_seqs=job["max_num_seqs"], speculative_config=job["speculative_config"],
              gpu_memory_utilization=job["memory_fraction"], disable_log_stats=False, enforce_eager=True)
    engine = llm.llm_engine
    greedy = SamplingParams(temperature=0.0, max_tokens=job.get("warmup_tokens", 8), ignore_eos=False)
    if job.get("warmup"):
        drive(engine, greedy, {"name": "warmup", "kind": "closed", "batch": job["max_num_seqs"],
                               "prompts": job["warmup"]}, lambda *a, **k: None)
    emit("ready", startup_s=time.perf_counter() - t0, vllm_version=vllm.__version__,
         torch_version=torch.__version__)
    for run in job["runs"]:
        params = SamplingParams(temperature=0.0, max_tokens=run["max_tokens"], ignore_eos=False)
        before = spec_counters(llm)
        ts = time.perf_counter()
        steps = drive(engine, params, run, emit)
        emit("run", run=run["name"], wall_s=time.perf_counter() - ts, steps=steps,
             spec=counter_delta(spec_counters(llm), before))
    emit("done")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
