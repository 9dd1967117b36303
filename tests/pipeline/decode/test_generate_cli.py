"""`draftgym generate --batch-size B` on the batched engine: one JSON line per prompt, equal to the
batch-1 command's output in fp32; sampling and bad inputs."""
from __future__ import annotations

import json

import pytest

from online.cli import main as cli

PROMPTS = ["What is 2+2?", "Name a colour.", "", "Write a haiku about the sea.", "Hi", "Count to five."]


def _lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@pytest.fixture
def prompts_file(tmp_path):
    f = tmp_path / "prompts.txt"
    f.write_text("\n".join(PROMPTS) + "\n")
    return f


@pytest.mark.parametrize("shape", [["--chain", "2"], ["--depth", "3", "--width", "4", "--verify-size", "10"],
                                   ["--method", "ar"]], ids=["chain2", "tree", "ar"])
def test_generate_batch_equals_batch1(tmp_path, tiny_model_dir, prompts_file, capsys, shape):
    """--batch-size 2 over 5 prompts (refills): one JSON line per prompt in order, each equal to the
    batch-1 command's output (fp32, greedy), and a summary line on stderr naming B and the shape."""
    base = ["generate", "--model", str(tiny_model_dir), "--head", "random", "--max-new-tokens", "12", *shape]
    assert cli([*base, "--batch-size", "2", "--prompts-file", str(prompts_file)]) == 0
    out, err = capsys.readouterr()
    rows = _lines(out)
    texts = [p for p in PROMPTS if p]
    assert [r["index"] for r in rows] == list(range(len(texts)))
    assert [r["prompt_id"] for r in rows] == [f"prompts/{i}" for i, p in enumerate(PROMPTS) if p]
    summary = json.loads(err.strip().splitlines()[-1])
    want_shape = {"chain2": "chain:2", "tree": "tree:3,4,10", "ar": "off"}[
        "ar" if "ar" in shape else "chain2" if "--chain" in shape else "tree"]
    assert summary["batch_size"] == 2 and summary["shape"] == want_shape and summary["prompts"] == len(texts)
    assert summary["new_tokens"] == sum(r["new_tokens"] for r in rows) and summary["tokens_per_s"] > 0
    assert summary["max_active"] == 2
    for r, text in zip(rows, texts):
        assert cli([*base, "--prompt", text, "--json"]) == 0
        one = json.loads(capsys.readouterr().out)
        assert r["output_ids"] == one["output_ids"] and r["text"] == one["text"]
        assert r["new_tokens"] == len(r["output_ids"]) and r["cycles"] >= 1


def test_generate_batch_jsonl_and_sampling(tmp_path, tiny_model_dir, capsys):
    """A JSONL file of prompt / messages rows; T > 0: prompt i samples with seed + i, as the batch-1
    command with that seed."""
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"prompt": "Tell me a joke."}) + "\n"
                 + json.dumps({"messages": [{"role": "user", "content": "Why is the sky blue?"}], "prompt_id": "sky"})
                 + "\n" + json.dumps({"prompt": "One more."}) + "\n")
    base = ["generate", "--model", str(tiny_model_dir), "--head", "random", "--max-new-tokens", "10",
            "--temperature", "1.0", "--chain", "3"]
    assert cli([*base, "--seed", "5", "--batch-size", "3", "--prompts-file", str(f)]) == 0
    rows = _lines(capsys.readouterr().out)
    assert [r["prompt_id"] for r in rows] == ["p/0", "sky", "p/2"]
    for i, (r, text) in enumerate(zip(rows, ["Tell me a joke.", "Why is the sky blue?", "One more."])):
        assert cli([*base, "--seed", str(5 + i), "--prompt", text, "--json"]) == 0
        assert r["output_ids"] == json.loads(capsys.readouterr().out)["output_ids"]


def test_generate_batch_bad_inputs(tmp_path, tiny_model_dir, prompts_file, capsys):
    base = ["generate", "--model", str(tiny_model_dir), "--head", "random"]
    cases = [(["--prompts-file", str(prompts_file)], "--prompts-file needs --batch-size"),
             (["--batch-size", "2"], "give one of --prompt and --prompts-file"),
             (["--batch-size", "2", "--prompts-file", str(tmp_path / "none.txt")], "prompts file not found"),
             (["--batch-size", "0", "--prompt", "Hi"], "argument --batch-size: must be >= 1"),
             (["--chain", "0", "--prompt", "Hi"], "argument --chain: must be >= 1")]
    (tmp_path / "blank.txt").write_text("\n  \n")
    cases.append((["--batch-size", "2", "--prompts-file", str(tmp_path / "blank.txt")], "no prompts"))
    for argv, msg in cases:
        assert cli([*base, *argv]) == 2, argv
        err = capsys.readouterr().err
        assert msg in err and err.startswith(("draftgym: error:", "draftgym generate: error:")), err
        assert len(err.strip().splitlines()) == 1, err
