"""`draftgym validate`'s re-anchored sim-vs-real: each method replayed on the text it decoded itself.

Why. sim_vs_real replays a method on the *logged* sequence of a prompt and compares with the
*measured* decoding of that prompt. In fp32 the two texts are the same (greedy decoding is lossless),
so the comparison isolates the simulator. In bf16 the decoded text leaves the logged one at the first
rounding near-tie (pipeline/decode/lossless.py), and from there on the replay walks a different text:
its acceptance lengths, and so tau and tokens/s, belong to another generation. A bf16 MT-bench report
showed static (8,10,60) at tau error -18.4 % with a divergence at token 7 of one of its 3 prompts: that
error mixes the simulator's error with the text's.

What. After the decoding, each method's own greedy output (one run's: at T = 0 the runs decode the
same text) is collected as collection does it (pipeline/collect/prompt.collect_prompts: teacher
forcing, the draft trees of every root, the acceptance table against that text), written as a logs
root with collection's own shard writer, loaded with simulator.logs.replay_logs.load_logs, and replayed with
the same policy object and the same latency clock as the logs' row. Then

    re-anchored error = (replay on the method's own text - measured) / measured,

which leaves only the simulator's error: for a static shape the replay reproduces the measured cycles'
accepted lengths (up to rounding differences between teacher forcing and incremental decoding in the
draft scores), so the re-anchored tau error is about 0; in fp32 it equals the logs' error.

Layout: one root per validation, `<out>/reanchored/<run_id>/`, partitioned like any logs root
(sequences/positions, model=, dataset=, temperature=0). A sequence is one distinct (prompt, decoded
text): its prompt_id is `<prompt_id>@<sha1(text)[:10]>`, so methods that decoded the same text share
one collection (in fp32 every method decodes AR's text: one collection per prompt, whatever the number
of methods); `Reanchored.seq_ids` says which sequence is whose.

Cost: per distinct text, one batch-1 AR pass for the lookahead (prefill + max_depth steps) and a share
of one batched teacher-forced collection, against `runs` x methods decodings of the same length;
collection runs > 3x faster than decoding, so this is cheap next to validate and is on by default
(`Batch1Config.reanchor`, `--no-reanchor` to skip it). Only at T = 0: at T > 0 the logs are the
sampled continuation coupled to the replay (docs/design.md), and a decoded sample is not a text whose
acceptance a teacher-forced pass could reproduce.
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pipeline import metrics
from pipeline.collect.actor import GROUP_PROMPTS, GROUP_TOKENS, write_prompt_log
from pipeline.collect.prompt import collect_prompts, CollectConfig, generate_past_eos, PromptLog
from pipeline.decode.engine.prefill import length_groups
from pipeline.errors import DraftGymError
from pipeline.logs.storage import resolve_out
from pipeline.runtime.fingerprint import environment_fingerprint
from simulator.logs.replay_logs import load_logs
from simulator.replay import simulate


@dataclass
class Reanchored:
    """The decoded texts' own logs for one dataset, and which sequence holds each method's text."""

    logs: object                                   # simulator.logs.replay_logs.ReplayLogs: one sequence per distinct text
    seq_ids: dict = field(default_factory=dict)    # method -> {prompt index: its text's prompt_id in `logs`}
    info: dict = field(default_factory=dict)       # root, texts, collect_s, runs_disagree (for the report)

    def replay(self, name: str, pol, order: list[int], clock, real_tau: float | None, real_dec: list[float]) -> dict:
        """`pol` (the policy object of the logs' row) replayed on method `name`'s own texts of the
        prompts `order` (indices into the dataset's records, the logs' row's), timed by `clock`; errors
        against the same measured tau and per-prompt decode tokens/s as the logs' row. Reusing the
        object is sound: simulate resets it, and no policy that runs online indexes the rows of the
        logs it was built with (the oracle does, and validate refuses it)."""
        ids = [self.seq_ids[name][i] for i in order if i in self.seq_ids[name]]
        ev = self.logs.subset(np.isin(self.logs.prompt_id, ids))     # texts of <= 1 token are not in the logs
        if ev.n_sequences == 0:
            return {"note": "no re-anchored sequence to replay (every text was <= 1 token)"}
        res = simulate(pol, ev, clock)
        sim_tau = float(metrics.tau(res.tokens.sum(), res.cycles.sum()))
        sim_dec = float(np.mean(res.tokens_per_s))
        real = float(np.mean(real_dec))
        return {"sim_tau": sim_tau, "tau_rel_error": metrics.rel_error(sim_tau, real_tau),
                "sim_decode_tokens_per_s": sim_dec, "tokens_per_s_rel_error": metrics.rel_error(sim_dec, real),
                "sequences": int(ev.n_sequences)}


def text_id(prompt_id: str, output_ids) -> str:
    """The prompt_id of one (prompt, decoded text) sequence: `<prompt_id>@<sha1 of the text>[:10]`."""
    return f"{prompt_id}@" + hashlib.sha1(json.dumps([int(t) for t in output_ids]).encode()).hexdigest()[:10]


def with_lookahead(engine, prompt_ids: list[int], output_ids: list[int], stop: str, lookahead: int):
    """(y, T, stop) for collect_prompts: the decoded text (T tokens) plus `lookahead` greedy tokens
    after it, so the acceptance of trees rooted near the end is exact, as in collection
    (generate_continuation). The lookahead comes from the batch-1 engine on prompt + text, past EOS
    (pipeline/collect/prompt.generate_past_eos): batch-1 rounding is the decoding's, where the batched
    generator's could break a bf16 near-tie differently. A text that ended at EOS gets none, as collection cuts y
    at the first EOS (pipeline/collect/prompt._cut)."""
    y, T = list(output_ids), len(output_ids)
    if stop == "eos" or lookahead <= 0:
        return y, T, stop
    return y + generate_past_eos(engine, list(prompt_ids) + y, lookahead), T, stop


def collect_texts(engine, head, prompts: list[list[int]], texts: list[tuple[list[int], str]],
                  cfg: CollectConfig) -> tuple[list[PromptLog], list[float]]:
    """collect_prompts on given greedy texts [(output_ids, stop_reason), ...] (each with its
    lookahead): (one PromptLog per text, each text's share of the wall time). Texts are teacher-forced
    in groups of similar length bounded as the collection actor bounds them (GROUP_PROMPTS prompts,
    GROUP_TOKENS padded tokens)."""
    conts = [with_lookahead(engine, p, out, stop, cfg.max_depth) for p, (out, stop) in zip(prompts, texts)]
    spans = [len(p) + len(c[0]) for p, c in zip(prompts, conts)]
    order = sorted(range(len(prompts)), key=spans.__getitem__)
    logs, secs = [None] * len(prompts), [0.0] * len(prompts)
    for gi in length_groups([spans[i] for i in order], GROUP_PROMPTS, GROUP_TOKENS):
        idx = [order[i] for i in gi]
        t0 = time.perf_counter()
        got = collect_prompts(engine, head, [prompts[i] for i in idx], cfg, continuations=[conts[i] for i in idx],
                              batch_size=len(idx))
        share = (time.perf_counter() - t0) / len(idx)
        for i, log in zip(idx, got):
            logs[i], secs[i] = log, share
    return logs, secs


def reanchor_dataset(engine, head, runs: dict, recs, idx: list[int], cfg: CollectConfig, root: str | Path,
                     env_json: str) -> Reanchored:
    """Collect and load the own texts of every method of `runs` but AR for the prompts `idx` of `recs`
    (records with prompt_id and split). The texts are the last run's; `runs_disagree` counts, per
    method, the prompts whose text differed between runs (0 when decoding is deterministic)."""
    t0 = time.perf_counter()
    methods = [n for n in runs if n != "ar"]
    seq_ids = {n: {} for n in methods}
    todo = {}                                        # text prompt_id -> (prompt index, GenerationResult)
    disagree = {}
    for n in methods:
        last = runs[n].results[-1]
        disagree[n] = sum(any(run[i].output_ids != last[i].output_ids for run in runs[n].results) for i in idx)
        for i in idx:
            sid = text_id(recs[i].prompt_id, last[i].output_ids)
            seq_ids[n][i] = sid
            todo.setdefault(sid, (i, last[i]))
    sids = list(todo)
    prompts = [todo[s][1].prompt_ids for s in sids]
    logs, secs = collect_texts(engine, head, prompts, [(todo[s][1].output_ids, todo[s][1].stop_reason) for s in sids],
                               cfg)
    store = resolve_out(root)
    for s, p, log, sec in zip(sids, prompts, logs, secs):      # the collection actor's writer: the same tables
        write_prompt_log(store, cfg, head.head_id, env_json, s, cfg.dataset, recs[todo[s][0]].split, p, log, sec)
    loaded = load_logs(root, model=cfg.model, temperature=0.0, datasets=[cfg.dataset], widths="all", dtype=cfg.dtype)
    info = {"root": str(root), "texts": len(sids), "collect_s": time.perf_counter() - t0, "runs_disagree": disagree}
    return Reanchored(logs=loaded, seq_ids=seq_ids, info=info)


def reanchor_for_validate(cfg, sim, engine, head, recs, runs: dict, dtype: str, run_id: str):
    """validate's re-anchoring of one dataset (module docstring): a `Reanchored`, a {"note": why not}
    when it could not be done (a one-line error: the rest of the report stands), or None when it is
    not wanted (cfg.reanchor off, T > 0, no sim-vs-real). `sim` is validate's SimSide: the collection
    takes the logs' widths, depth and verify grid, so every policy replayed on them runs on these too.
    With --logs-dtype the re-anchored logs are still the decoding's dtype (this engine collects them):
    the two errors then differ by all that reusing the other dtype's logs costs, text included."""
    if not cfg.reanchor or cfg.temperature > 0 or sim is None or sim.note:
        return None

    logged = set(sim.logs.prompt_id.tolist())
    idx = [i for i, r in enumerate(recs) if r.prompt_id in logged]   # sim-vs-real leaves the others out
    if not idx:
        return None
    lg = sim.logs
    ccfg = CollectConfig(model=cfg.model, head=cfg.head, dtype=dtype, dataset=recs[0].dataset, split=recs[0].split,
                         n_prompts=None, max_new_tokens=cfg.max_new_tokens, temperature=0.0, seed=cfg.seed,
                         widths=tuple(int(w) for w in lg.widths), max_depth=int(lg.max_depth),
                         verify_grid=tuple(int(v) for v in lg.verify_grid))
    root = Path(cfg.out) / "reanchored" / run_id
    try:
        return reanchor_dataset(engine, head, runs, recs, idx, ccfg, root,
                                json.dumps(environment_fingerprint(engine.device, dtype)))
    except DraftGymError as e:                     # a DataError too
        return {"note": f"no re-anchored replay: {e}"}
