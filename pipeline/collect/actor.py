"""The collection actor: one model copy (target + head) that collects prompts and writes their shards.

Shards of one prompt (hive partitions, on the job's LogStore, written atomically):

    positions/<partition>/<run_key>-<prompt_hash>-w<W>.parquet    (one per width)
    sequences/<partition>/<run_key>-<prompt_hash>.parquet         (written last: the commit marker)
    failures/<partition>/<run_key>-<prompt_hash>.parquet          (only if the prompt raised)

An exception on one prompt (an out-of-memory error included) is recorded in `failures` and the
actor goes on with the next prompt; a committed prompt has no failures row (a successful retry
deletes it). The environment fingerprint is this actor's, taken on the machine it runs on.
"""
from __future__ import annotations

import gc
import json
import time

import numpy as np
import pyarrow as pa

from pipeline.decode.engine.prefill import length_groups
from pipeline.collect.prompt import CollectConfig, collect_prompt, collect_prompts, generate_continuations
from pipeline.errors import DraftGymError, first_line
from pipeline.logs.schema import (FAILURES, SCHEMA_VERSION, SEQUENCES, partition_parts, positions_table, prompt_hash,
                                  write_atomic)
from pipeline.logs.storage import LogStore

FAIL_AFTER_ENV = "DRAFTGYM_FAIL_AFTER"    # tests: the actor dies (outside the per-prompt try) after N prompts
FAIL_PROMPT_ENV = "DRAFTGYM_FAIL_PROMPT"  # tests: comma-separated prompt ids that raise inside the per-prompt try
# Prompts teacher-forced and expanded together: at most GROUP_PROMPTS, and at most GROUP_TOKENS padded
# tokens (the group is right-padded to its longest sequence, and every layer's hidden states are held
# at once). Continuations are generated together in batches of at most GEN_TOKENS slot tokens (rows x
# the longest row's prompt + new tokens), since every decode step attends over the longest live row.
# Without these caps, one 2,585-token ShareGPT prompt in a batch of 64 makes all 64 rows attend over
# 2,600 keys and pads its group of 8 to 8 x 2,650 tokens.
GROUP_PROMPTS, GROUP_TOKENS, GEN_TOKENS = 16, 4096, 32768


def table_dir(store: LogStore, table: str, cfg: CollectConfig, dataset: str) -> str:
    return store.path(*partition_parts(table, cfg.model, dataset, cfg.temperature))


def shard_paths(store: LogStore, cfg: CollectConfig, dataset: str, prompt_id: str) -> dict:
    """{'sequences': path, 'failures': path, 'positions': {W: path}} of one prompt."""
    key, h = cfg.run_key(), prompt_hash(prompt_id)
    pos = table_dir(store, "positions", cfg, dataset)
    return {"sequences": f"{table_dir(store, 'sequences', cfg, dataset)}/{key}-{h}.parquet",
            "failures": f"{table_dir(store, 'failures', cfg, dataset)}/{key}-{h}.parquet",
            "positions": {W: f"{pos}/{key}-{h}-w{W}.parquet" for W in cfg.widths}}


def error_line(e: BaseException, limit: int = 500) -> str:
    """'<ExceptionType>: <first line of the message>' (truncated)."""
    line = f"{type(e).__name__}: {first_line(e)}" if str(e).strip() else type(e).__name__
    return line if len(line) <= limit else line[: limit - 3] + "..."


class CollectorActor:
    """Holds one model copy; processes prompt batches; writes shards; returns one summary row per prompt
    (status 'ok', 'skipped: <why>' or 'failed: <error>'). A skipped prompt (empty, or too long for the
    target's positions: the input's fault, skipped on every run) and a failed one get a failures row."""

    def __init__(self, cfg_json: str, store: LogStore, device: str | None = None, fail_after: int = 0,
                 fail_prompts: tuple[str, ...] = (), model_path: str | None = None, head_spec: str | None = None,
                 continuation_cache: bool = True):
        import torch

        from pipeline.decode.engine.single import Engine
        from pipeline.runtime.fingerprint import environment_fingerprint
        from pipeline.models.head import load_head_for
        from pipeline.models.target import load_target

        self.cfg = CollectConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in json.loads(cfg_json).items()})
        self.store = store
        self.target = load_target(model_path or self.cfg.model, device=device, dtype=self.cfg.dtype)
        self.env_json = json.dumps(environment_fingerprint(self.target.device, self.target.dtype))
        self.head = load_head_for(head_spec or self.cfg.head, self.target.model, self.cfg.seed)
        self.engine = Engine(self.target.model, self.head, self.target.eos_token_ids)
        # continuations on disk ($DRAFTGYM_CACHE/continuations on the actor's node), reused by later runs
        # with another head or widths; the device name (backend, threads) is in the key, since the
        # rounding of another device could change a greedy continuation at a near-tie
        from pipeline.decode.continuations import ContinuationCache
        from pipeline.runtime.fingerprint import device_name
        self.continuations = (ContinuationCache(f"{self.cfg.model}|{device_name(self.target.device)}", self.cfg.dtype)
                              if continuation_cache else None)
        self.fail_after, self.fail_prompts = fail_after, set(fail_prompts)
        self.done = 0
        torch.manual_seed(self.cfg.seed)

    def __call__(self, batch: dict) -> dict:
        from pipeline.datasets import has_user_text
        from pipeline.models.target import encode_prompt

        rows = {"prompt_id": [], "status": [], "positions": [], "seconds": []}

        def emit(pid, status, positions=0, seconds=0.0):
            rows["prompt_id"].append(pid); rows["status"].append(status)
            rows["positions"].append(positions); rows["seconds"].append(seconds)

        todo = []                                # (pid, ds, split, ids, t0) of the prompts that encode
        for pid, ds, split, msgs in zip(batch["prompt_id"], batch["dataset"], batch["split"], batch["messages"]):
            t0 = time.perf_counter()
            try:
                messages = json.loads(msgs)
                if not has_user_text(messages):
                    raise DraftGymError("empty prompt (no user message with text)")
                max_prompt = self.engine.max_positions - self.cfg.max_new_tokens - 2 * self.cfg.max_depth - 2
                ids = encode_prompt(self.target.tokenizer, messages, max_prompt_tokens=max_prompt)
            except DraftGymError as e:          # empty, too long: the input's fault, skipped every run
                self._write_failure(pid, ds, split, f"skipped: {e}")
                emit(pid, f"skipped: {e}")
                continue
            todo.append((pid, ds, split, ids, t0))
        # The batch together, sorted by length (a generation batch attends over its longest live row, a
        # teacher-forcing group is padded to its longest sequence): continuations in batches of at most
        # GEN_TOKENS, then teacher forcing and tree expansion in groups of at most GROUP_PROMPTS /
        # GROUP_TOKENS (pipeline.collect.prompt.collect_prompts), each group written before the next starts.
        # If the batched path raises (an OOM on one long prompt), the prompts concerned run alone, so
        # that one bad prompt fails alone and the others commit.
        todo.sort(key=lambda x: len(x[3]))
        t_gen = time.perf_counter()
        conts = self._continuations([x for x in todo if x[0] not in self.fail_prompts])
        gen_share = (time.perf_counter() - t_gen) / max(len(conts), 1)   # a prompt's share of the batched generation
        for gi in length_groups([self._span(x[3]) for x in todo], GROUP_PROMPTS, GROUP_TOKENS):
            group = [todo[i] for i in gi]
            t_group = time.perf_counter()
            logs = self._collect_group([x for x in group if x[0] in conts], conts)
            group_share = (time.perf_counter() - t_group) / max(len(logs), 1)
            for pid, ds, split, ids, _ in group:
                t0 = time.perf_counter()
                shared = gen_share + group_share if pid in logs else 0.0   # collect_s: this prompt's share
                if self.fail_after and self.done >= self.fail_after:   # a killed actor, not a failed prompt
                    raise RuntimeError(f"injected failure after {self.done} prompts ({FAIL_AFTER_ENV})")
                error = None
                try:
                    if pid in self.fail_prompts:
                        raise RuntimeError(f"injected failure on prompt {pid} ({FAIL_PROMPT_ENV})")
                    log = logs.pop(pid, None) or collect_prompt(self.engine, self.head, ids, self.cfg)
                    n = self._write(pid, ds, split, ids, log, shared + time.perf_counter() - t0)
                except Exception as e:              # OOM (torch.cuda.OutOfMemoryError, MemoryError), a bug: this prompt only
                    error = error_line(e)
                if error is not None:
                    self._free_memory()
                    self._write_failure(pid, ds, split, error)
                    emit(pid, f"failed: {error}", seconds=time.perf_counter() - t0)
                    continue
                self.done += 1
                emit(pid, "ok", n, shared + time.perf_counter() - t0)
        return {k: np.array(v) for k, v in rows.items()}

    def _span(self, prompt_ids) -> int:
        """Tokens a prompt's sequence reaches: the prompt, the continuation and its lookahead."""
        return len(prompt_ids) + self.cfg.max_new_tokens + self.cfg.max_depth

    def _continuations(self, todo) -> dict:
        """{prompt_id: (y, T, stop)} for the prompts of `todo` (sorted by length), generated together in
        batches of at most GEN_TOKENS slot tokens, or read from the continuation cache. A batch whose
        generation raised is left out (each of its prompts then generates its own, alone)."""
        out = {}
        for gi in length_groups([self._span(x[3]) for x in todo], len(todo), GEN_TOKENS):
            part = [todo[i] for i in gi]
            try:
                conts = generate_continuations(self.engine, [x[3] for x in part], self.cfg, self.cfg.max_depth,
                                               cache=self.continuations, batch_size=len(part))
            except Exception:
                self._free_memory()
                continue
            out.update({x[0]: c for x, c in zip(part, conts)})
        return out

    def _collect_group(self, group, conts: dict) -> dict:
        """{prompt_id: PromptLog} for a group with continuations, teacher-forced and expanded together;
        {} if that raised."""
        if not group:
            return {}
        try:
            logs = collect_prompts(self.engine, self.head, [x[3] for x in group], self.cfg,
                                   continuations=[conts[x[0]] for x in group], batch_size=len(group))
        except Exception:
            self._free_memory()
            return {}
        return {x[0]: log for x, log in zip(group, logs)}

    @staticmethod
    def _free_memory() -> None:
        import torch

        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def _write_failure(self, pid, ds, split, error: str) -> None:
        row = {"schema_version": SCHEMA_VERSION, "run_key": self.cfg.run_key(), "prompt_id": pid, "dataset": ds,
               "split": split, "error": error, "config_json": self.cfg.to_json(), "env_json": self.env_json,
               "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        path = shard_paths(self.store, self.cfg, ds, pid)["failures"]
        write_atomic(pa.Table.from_pylist([row], schema=FAILURES), path, "failures", filesystem=self.store.fs)

    def _write(self, pid, ds, split, ids, log, seconds) -> int:
        return write_prompt_log(self.store, self.cfg, self.head.head_id, self.env_json, pid, ds, split, ids, log, seconds)


def write_prompt_log(store: LogStore, cfg: CollectConfig, head_id: str, env_json: str, pid: str, ds: str, split: str,
                     ids: list[int], log, seconds: float) -> int:
    """Positions shards, then the sequences shard (the commit), then drop a failures row of an
    earlier attempt. Returns the number of positions rows written."""
    key, fs = cfg.run_key(), store.fs
    paths = shard_paths(store, cfg, ds, pid)
    total = 0
    for W, cols in log.positions.items():
        total += len(cols["position"])
        table = positions_table(key, pid, cols["position"], cols["context_len"], W, cols["root_token"],
                                cols["acceptance"], cols["beam_scores"], cols["candidate_scores"], cols["entropy"],
                                cols.get("accept_dist"), max_depth=cfg.max_depth,
                                n_grid=len(cfg.verify_grid))
        write_atomic(table, paths["positions"][W], "positions", filesystem=fs)
    row = {"schema_version": SCHEMA_VERSION, "run_key": key, "prompt_id": pid, "split": split,
           "model_id": cfg.model, "head_id": head_id, "dtype": cfg.dtype, "seed": cfg.seed, "prompt_tokens": ids,
           "output_tokens": log.output_tokens, "new_tokens": log.new_tokens, "stop_reason": log.stop_reason,
           "widths": list(cfg.widths), "max_depth": cfg.max_depth, "verify_grid": list(cfg.verify_grid),
           "config_json": cfg.to_json(), "env_json": env_json, "collect_s": seconds}
    write_atomic(pa.Table.from_pylist([row], schema=SEQUENCES), paths["sequences"], "sequences", filesystem=fs)
    store.delete(paths["failures"])
    return total
