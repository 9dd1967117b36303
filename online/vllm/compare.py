"""The replay against vLLM: what `draftgym vllm-run --compare-logs` prints beside vLLM's own figures.

    prompt_logs      DraftGym's logs of exactly the prompts vLLM decoded, in their order (read once)
    vllm_costs       a latency model of a vllm_steps.jsonl (imported as profile-import does, prefills included)
    compare_replay   each static chain's speculation counters replayed on those logs
                     (simulator/serving/formats/vllm_counters.py) beside vLLM's at B = 1
    predict_closed   the replay's closed-batch tokens/s on vLLM's own step costs beside vLLM's decode tokens/s
    predict_load     each load run replayed with the same arrivals on vLLM's costs beside vLLM's throughput
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.decode import step_shape
from pipeline.errors import DataError
from simulator.latency.model import LatencyModel
from simulator.logs.replay_logs import load_logs
from simulator.serving.choosers.base import ScheduleChooser, StaticChooser
from simulator.serving.formats.sglang_import import latency_rows, read_bench, read_prefill
from simulator.serving.formats.vllm_counters import chain_counters
from simulator.serving.load import serve
from simulator.serving.metrics import summarize
from simulator.serving.replay import closed_batch, ShapeTable
from simulator.serving.schedule import Schedule


def prompt_logs(root: str, prompt_ids: list[str], dtype: str):
    """The logs under `root` of exactly these prompts, in this order (a one-line DataError naming a missing one)."""
    logs = load_logs(root, widths="all", dtype=dtype)
    where = {str(p): i for i, p in enumerate(logs.prompt_id.tolist())}
    missing = [p for p in prompt_ids if p not in where]
    if missing:
        raise DataError(f"{len(missing)} prompts are not in {root}, e.g. {missing[0]}")
    return logs.subset(np.array([where[p] for p in prompt_ids], np.int64))


def vllm_costs(curve_path: Path, model: str, dtype: str):
    """A LatencyModel of a vllm_steps.jsonl: vLLM's step per (B, k) and its prefills."""
    rows, _ = latency_rows(read_bench(curve_path), model, dtype, "vllm-run", curve_path.name, 0, "vllm-steps",
                           read_prefill(curve_path))
    return LatencyModel.from_rows(rows, model=model, profile="vllm-run")


def compare_replay(logs, results: dict, configs: list) -> list:
    """Each static chain's replayed counters on the prompts' logs beside vLLM's at B = 1 (or its first run)."""
    rows = []
    for sc in configs:
        if sc.k == 0 or sc.ranges:
            continue
        runs = results[sc.name]["runs"]
        name = "B1" if "B1" in runs else next(iter(runs), None)
        if name is None:
            continue
        pred = chain_counters(logs, sc.k)
        got = runs[name]
        rows.append({"config": sc.name, "run": name, "vllm_mean_acceptance_length": got["mean_acceptance_length"],
                     "replay_mean_acceptance_length": pred["mean_acceptance_length"],
                     "vllm_acceptance_per_pos": got["acceptance_per_pos"], "replay_acceptance_per_pos": pred["acceptance_per_pos"],
                     "vllm_drafts": got["spec"].get("num_drafts"), "replay_drafts": pred["num_drafts"]})
    return rows


def predict_closed(logs, lat, results: dict, configs: list, batch_sizes) -> list:
    """The replay's closed-batch tokens/s with vLLM's own step costs (this run's cost curve) beside vLLM's decode
    tokens/s at the same B (its steps with B requests in flight and none joining: the replay charges no prefill)."""
    static = [sc for sc in configs if not sc.ranges]
    table = ShapeTable(logs, [step_shape.chain(sc.k) for sc in static])
    rows = []
    for B in sorted(int(b) for b in batch_sizes):
        res = closed_batch(logs, lat, table, B)
        for i, sc in enumerate(static):
            got = results[sc.name]["runs"].get(f"B{B}", {}).get("decode_tokens_per_s", {}).get(B)
            if got:
                want = float(res["tokens_per_s"][i])
                rows.append({"config": sc.name, "batch": B, "vllm_decode_tokens_per_s": got,
                             "replay_tokens_per_s": want, "error": want / got - 1.0})
    return rows


def predict_load(logs, lat, results: dict, configs: list, loads: dict, max_batch: int) -> list:
    """Each load run (--rates, --trace) replayed with the same arrivals, the same requests in the same order, the same
    max batch and vLLM's own step costs (and its prefills, where the cost curve has them), beside vLLM's
    throughput over the same span (first arrival to last finish) and its TPOT."""
    choosers = {sc.name: ScheduleChooser(Schedule.from_vllm(sc.ranges), sc.name) if sc.ranges
                else StaticChooser(step_shape.chain(sc.k), sc.name) for sc in configs}
    shapes = sorted({s for c in choosers.values() for s in c.shapes()})
    table = ShapeTable(logs, shapes)
    rows = []
    for run, (arrivals, seq) in loads.items():
        for name, ch in choosers.items():
            got = results.get(name, {}).get("runs", {}).get(run)
            if not got:
                continue
            res = serve(logs, lat, table, ch, np.asarray(arrivals), max_batch, request_seq=np.asarray(seq))
            want = summarize(res)
            rows.append({"config": name, "run": run, "vllm_tokens_per_s": got["span_tokens_per_s"],
                         "replay_tokens_per_s": want["wall_tokens_per_s"],
                         "error": want["wall_tokens_per_s"] / got["span_tokens_per_s"] - 1.0,
                         "vllm_tpot_mean_ms": got["tpot_mean_ms"], "replay_tpot_mean_ms": 1e3 * want["tpot_mean_s"],
                         "replay_mean_batch": want["mean_batch"]})
    return rows
