"""Targets beyond Llama, decoded with drafts that are actually accepted: Qwen2, Qwen3, Mistral, Gemma-2
(soft-capped logits, alternating sliding/full attention), Phi-3, and Llama as the control.

Each target is a tiny random model built from its transformers config class, saved with
`save_pretrained` beside a tiny word-level tokenizer, and loaded back through DraftGym's own
`load_target` (nothing is downloaded). Its lm_head is scaled up so its next-token distributions are
peaked, as a trained LM's are (a flat random model's greedy choice hangs on rounding-level gaps).

The head that gets accepted: the real `draftgym train-draft` command trains it on the target's own
greedy continuations (self-distillation, written as a frozen dataset and passed with `--data`), for a
few dozen steps. A random target's greedy continuations settle into short repeating patterns, which
a head learns within those steps, so on those prompts most cycles accept drafts (tau > 1.5; before,
only Llama targets had decoded with accepted drafts). Then, per architecture:
- EAGLE-3 output equals AR output token for token in fp32 (pipeline.decode.lossless.classify: 'exact'),
  with tau > 1.5, so acceptance, KV compaction and the feedback of the accepted entries' features run;
- the collection replay (pipeline.collect.prompt) gives the online engine's accepted length in every
  cycle;
- the trained head loads back (pipeline.models.head.load_head) and captures the target layers
  (2, L // 2, L - 3) of the target's config; its passthrough initialisation already ranks tokens
  (Gemma's final norm scales by 1 + weight: pipeline.train_head.initialise.norm_scale);
- sliding windows are refused up front when prompt + new tokens + verify tree could pass them
  (pipeline.models.arch), and decode exactly just inside;
- a head written in SpecForge's Qwen3 layout (sgl-project/SpecForge configs/qwen3-4b-eagle3.json: the
  LlamaForCausalLMEagle3 architecture, Qwen's config keys, bf16 weights with embed_tokens, d2t and t2d)
  loads for a Qwen3 target and drafts.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from pipeline.models import arch
from pipeline.decode.controller import StaticController
from pipeline.decode.engine.single import Engine
from pipeline.models.head import load_head, random_head, target_layer_ids
from pipeline.decode.lossless import classify
from pipeline.errors import DraftGymError

VOCAB = 64
LAYERS = 7                                      # capture layers (2, 3, 4): all distinct
PROMPTS, PROMPT_LEN, NEW = 12, 8, 32            # self-distillation data
TRAIN = dict(steps=30, lr=1e-2, ttt_steps=3, warmup_steps=3)
SHAPE = (6, 4, 16)                              # (D, W, V) of the EAGLE-3 runs
ARCHS = ("llama", "qwen2", "qwen3", "mistral", "gemma2", "phi3")
TIMINGS: dict[str, float] = {}


def tiny_config(name: str, layers: int = LAYERS, window: int | None = None):
    """A tiny config of architecture `name` (window: a sliding window for the refusal tests)."""
    import transformers as tf

    common = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    if name == "llama":
        return tf.LlamaConfig(**common)
    if name == "qwen2":    # Qwen2 slides only with use_sliding_window, in layers >= max_window_layers
        return tf.Qwen2Config(**common, use_sliding_window=window is not None, sliding_window=window or 4096,
                              max_window_layers=2)
    if name == "qwen3":    # Qwen3's head_dim is its own (here 16, not hidden / heads = 8); q/k norms
        return tf.Qwen3Config(**common, head_dim=16)
    if name == "mistral":  # a sliding window in every layer (Mistral-7B-v0.1: 4096)
        return tf.MistralConfig(**common, sliding_window=window or 4096)
    if name == "gemma2":   # sliding / full layers alternate; attention and final logits soft-capped
        return tf.Gemma2Config(**common, head_dim=8, sliding_window=window or 4096, query_pre_attn_scalar=8,
                               attn_logit_softcapping=50.0, final_logit_softcapping=30.0)
    if name == "phi3":     # fused qkv_proj and gate_up_proj (Phi-3-mini-4k: sliding window 2047)
        return tf.Phi3Config(**common, sliding_window=window or 2047)
    raise ValueError(name)


def tiny_model(name: str, seed: int = 0, **kw):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(name, **kw)).eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(60.0)     # peaked next-token distributions
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def save_tokenizer(d: Path) -> None:
    """A word-level tokenizer over 't0' .. 't63' (ids = the numbers), no chat template, no EOS."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0").save_pretrained(d)


@dataclass
class Case:
    name: str
    target: object            # pipeline.models.target.Target, loaded from the saved directory
    seqs: list                # TrainSequence: random prompt + the target's greedy continuation
    head_dir: Path
    head: object              # the trained head, loaded back with load_head
    manifest: dict

    @property
    def model(self):
        return self.target.model

    def engine(self, head=None) -> Engine:
        return Engine(self.model, head or self.head, self.target.eos_token_ids)


def build_case(name: str, root: Path) -> Case:
    """Save the tiny target, load it with load_target, self-distil, train a head with `train-draft`."""
    from online.cli import main as cli
    from pipeline.decode.continuations import generate_batch
    from pipeline.models.target import load_target
    from pipeline.train_head.data import TrainSequence, freeze_sequences

    t0 = time.perf_counter()
    model_dir = root / "model"
    tiny_model(name, seed=ARCHS.index(name)).save_pretrained(model_dir)
    save_tokenizer(model_dir)
    target = load_target(str(model_dir), device="cpu", dtype="float32")
    assert type(target.model).__name__.lower().startswith(name)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, VOCAB, (PROMPT_LEN,), generator=gen).tolist() for _ in range(PROMPTS)]
    conts = generate_batch(target.model, prompts, NEW)                     # greedy, batched (train-draft's own)
    seqs = [TrainSequence(p + c.output_ids, len(p), f"tiny/{i}") for i, (p, c) in enumerate(zip(prompts, conts))]
    data = freeze_sequences(seqs, root / "data.parquet", {"datasets": {"tiny": len(seqs)}})["path"]
    head_dir = root / "head"
    argv = ["train-draft", "--model", str(model_dir), "--data", data, "--out", str(head_dir),
            "--work-dir", str(root / "work"), "--draft-vocab-size", str(VOCAB), "--batch-size", str(PROMPTS),
            "--amp", "none", "--dtype", "float32", "--device", "cpu", "--heldout-prompts", "0",
            "--checkpoint-every", "0", "--no-progress"]
    for k, v in TRAIN.items():
        argv += [f"--{k.replace('_', '-')}", str(v)]
    assert cli(argv) == 0
    manifest = json.loads((head_dir / "manifest.json").read_text())
    head = load_head(str(head_dir), target.model)
    TIMINGS[name] = time.perf_counter() - t0
    return Case(name, target, seqs, head_dir, head, manifest)


_CASES: dict[str, Case] = {}


def get_case(name: str, tmp_path_factory) -> Case:
    """Each architecture's case is built once per session (the SpecForge test reuses Qwen3's)."""
    if name not in _CASES:
        _CASES[name] = build_case(name, tmp_path_factory.mktemp(name))
    return _CASES[name]


@pytest.fixture(params=ARCHS)
def case(request, tmp_path_factory):
    return get_case(request.param, tmp_path_factory)


# -- accepted drafts, exact outputs ------------------------------------------------------------------

def test_eagle3_equals_ar_with_accepted_drafts(case):
    """fp32: EAGLE-3 == AR token for token ('exact'), and the trained head is accepted: tau > 1.5."""
    eng = case.engine()
    taus = []
    for s in case.seqs[:3]:
        prompt = s.ids[: s.prompt_len]
        ar = eng.generate_ar(prompt, NEW).output_ids
        assert ar == s.ids[s.prompt_len:]                                   # batched self-distillation == AR
        res = eng.generate(prompt, NEW, controller=StaticController(*SHAPE))
        assert classify(case.model, prompt, ar, res.output_ids).status == "exact"
        taus.append(res.tau)
    tau = sum(taus) / len(taus)
    print(f"{case.name}: tau {tau:.2f} ({', '.join(f'{t:.2f}' for t in taus)}); "
          f"target + train-draft {TIMINGS.get(case.name, float('nan')):.1f} s")
    assert tau > 1.5, (case.name, taus)


def test_replay_equals_online_cycle_by_cycle(case):
    """The collection's acceptance table, walked with a static (D, V), gives the online engine's L in
    every cycle, and drafts are accepted in it (the replay path sees the accepted case too)."""
    from pipeline.collect.prompt import CollectConfig, collect_prompt
    from tests.helpers import replay_static

    grid = (1, 2, 4, 8, 16)
    eng, W = case.engine(), SHAPE[1]
    cfg = CollectConfig(max_new_tokens=NEW, widths=(W,), max_depth=SHAPE[0], verify_grid=grid, position_batch=16)
    accepted = 0
    for s in case.seqs[:2]:
        prompt = s.ids[: s.prompt_len]
        log = collect_prompt(eng, case.head, prompt, cfg)
        acc = log.positions[W]["acceptance"].reshape(-1, SHAPE[0], len(grid))
        for D, V in [(SHAPE[0], 16), (2, 4)]:
            real = eng.generate(prompt, NEW, controller=StaticController(D, W, V))
            replay = replay_static(acc, log.new_tokens, D, V, grid)
            assert real.output_ids == log.output_tokens[: log.new_tokens]
            assert [c.accepted for c in real.cycles] == [L for _, L in replay]
            accepted += sum(c.accepted for c in real.cycles)
    assert accepted > 0


# -- the trained head on disk, the capture layers ---------------------------------------------------------

def test_train_draft_head_loads_and_captures_the_configs_layers(case):
    L = case.model.config.num_hidden_layers
    assert case.manifest["training"]["steps"] == TRAIN["steps"]
    # passthrough initialisation: the target's output layer read from layer L - 3 already beats a uniform
    # guess (scale 0); with Gemma's final norm copied as its raw weight (0) every scale scored the same
    init = case.manifest["init"]
    losses = init["loss_at_scale"]
    assert init["logit_scale"] > 0 and losses[str(init["logit_scale"])] < losses["0.0"] - 0.1, init
    assert sum(init["ce_per_step"]) / len(init["ce_per_step"]) < math.log(VOCAB), init
    assert tuple(case.head.layer_ids) == target_layer_ids(L) == (2, L // 2, L - 3)
    assert json.loads((case.head_dir / "config.json").read_text())["architectures"] == ["LlamaForCausalLMEagle3"]
    # the fused features are fc of exactly those hidden states (0 = embeddings, i = input of layer i)
    hs = case.model(torch.tensor([case.seqs[0].ids[:10]]), output_hidden_states=True).hidden_states
    assert len(hs) == L + 1
    want = torch.cat([hs[2], hs[L // 2], hs[L - 3]], -1) @ case.head.fc.weight.T
    torch.testing.assert_close(case.head.fuse(hs), want)


def test_capture_layers_follow_num_hidden_layers():
    for L in (3, 6, 12, 32):
        head = random_head(tiny_model("qwen3", layers=L))
        assert head.layer_ids == (2, L // 2, L - 3)
    with pytest.raises(DraftGymError, match=">= 3 layers"):
        random_head(tiny_model("mistral", layers=2))


# -- what is refused, up front ----------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["qwen2", "mistral", "gemma2", "phi3"])
def test_sliding_window_is_refused_up_front_and_exact_inside(name):
    """Window 32: the sliding caches keep 31 entries. prompt 6 + new 9 + V 16 = 31 fits and decodes
    exactly (the verify forwards write far more than 31 entries in all; compaction keeps the cache
    below 31); one token more is refused before anything runs, in one line, by EAGLE-3, AR and
    batched AR (prompt 6 + new 25 fits without a tree)."""
    from pipeline.decode.continuations import generate_batch

    model = tiny_model(name, window=32)
    assert arch.attention_window(model.config) == 32
    eng = Engine(model, random_head(model, seed=1))
    assert eng.max_positions == 31
    prompt = [5, 9, 2, 7, 1, 3]
    ar = eng.generate_ar(prompt, 25).output_ids
    res = eng.generate(prompt, 9, controller=StaticController(4, 4, 16))
    assert res.output_ids == ar[:9] and sum(c.verify_size for c in res.cycles) > 31
    assert generate_batch(model, [prompt], 25)[0].output_ids == ar
    for call in (lambda: eng.generate(prompt, 10, controller=StaticController(4, 4, 16)),
                 lambda: eng.generate_ar(prompt, 26), lambda: generate_batch(model, [prompt], 26)):
        with pytest.raises(DraftGymError, match="sliding attention window") as e:
            call()
        assert "\n" not in str(e.value)


def test_full_attention_is_not_windowed():
    """Qwen2 without use_sliding_window, and Gemma-2's config checks, read the layer types as transformers does."""
    assert arch.attention_window(tiny_config("qwen2")) is None
    assert arch.attention_window(tiny_config("llama")) is None
    assert arch.layer_types(tiny_config("gemma2"))[:2] == ["sliding_attention", "full_attention"]
    assert arch.max_positions(tiny_config("mistral")) == 256


def test_unsupported_cache_layers_are_refused():
    class Hybrid(torch.nn.Module):           # e.g. a Qwen3-Next-like stack: linear attention between full layers
        def __init__(self):
            super().__init__()
            self.config = tiny_config("llama")
            self.config.layer_types = ["linear_attention", "full_attention"] * 3 + ["full_attention"]
            self.w = torch.nn.Linear(2, 2)

    with pytest.raises(DraftGymError, match="'linear_attention' layers") as e:
        Engine(Hybrid(), None)
    assert "\n" not in str(e.value)


def test_gemma2_soft_capped_logits_are_the_models():
    """The engine takes Gemma-2's logits from the CausalLM (soft-capped: 30 tanh(z / 30), |.| < 30, visibly
    below lm_head's z); arch.output_logits, for code that recomputes them from the final hidden state,
    applies the same cap."""
    from pipeline.decode.verify import target_forward
    from transformers import DynamicCache

    model = tiny_model("gemma2")
    ids = torch.tensor([[3, 8, 1, 4, 4, 9]])
    logits, _ = target_forward(model, ids, torch.arange(6)[None], DynamicCache(config=model.config))
    h = model.model(input_ids=ids).last_hidden_state[0]
    raw = model.lm_head(h)
    assert logits.abs().max() < 30 and (raw - logits).abs().max() > 1
    torch.testing.assert_close(logits, arch.output_logits(model.config, raw))
    assert torch.equal(arch.output_logits(tiny_config("llama"), raw), raw)
    assert not arch.logits_are_lm_head(model.config) and arch.logits_are_lm_head(tiny_config("qwen3"))


@pytest.mark.parametrize("name", ARCHS)
def test_prefill_keeps_the_last_logits_only(name):
    """Every prefill asks for the last position's logits only (target_forward(last_only=True):
    logits_to_keep=1): the same row as the full forward's last one (Gemma-2's included: the CausalLM
    still soft-caps it), the same hidden states and KV entries, and no [q, vocab] logits."""
    from pipeline.decode.verify import target_forward
    from transformers import DynamicCache

    model = tiny_model(name)
    ids, pos = torch.tensor([[3, 8, 1, 4, 4, 9, 2, 7]]), torch.arange(8)[None]
    full_cache, last_cache = DynamicCache(config=model.config), DynamicCache(config=model.config)
    full, hs_full = target_forward(model, ids, pos, full_cache)
    last, hs_last = target_forward(model, ids, pos, last_cache, last_only=True)
    assert full.shape == (8, VOCAB) and last.shape == (1, VOCAB)
    torch.testing.assert_close(last[0], full[-1], rtol=1e-5, atol=1e-5)
    assert last.argmax().item() == full[-1].argmax().item()
    assert all(torch.equal(a, b) for a, b in zip(hs_full, hs_last))
    assert all(torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
               for a, b in zip(full_cache.layers, last_cache.layers))


def test_train_draft_labels_are_the_soft_capped_distribution():
    """The trainer's soft labels, which it computes from the target's final hidden state, are the
    CausalLM's own (soft-capped) next-token distribution: step 0's loss is the cross-entropy against
    softmax(model(...).logits) at the labelled positions, and differs from uncapped labels."""
    from pipeline.train_head.ttt import ttt_loss

    model = tiny_model("gemma2")
    head = random_head(model, seed=2)
    ids = torch.tensor([[3, 8, 1, 4, 4, 9, 2, 7]])                  # prompt 3 tokens, answer 5
    with torch.no_grad():
        out = model(ids, output_hidden_states=True)
        fused = torch.cat([out.hidden_states[i] for i in head.layer_ids], -1)
        final = model.model(input_ids=ids).last_hidden_state         # normed, before the lm_head
    args = (head, ids, torch.tensor([8]), torch.tensor([3]), fused, final, out.logits.argmax(-1),
            model.lm_head.weight, torch.arange(VOCAB), 1, 1.0, False)
    cap = []
    capped = ttt_loss(*args, capture=cap, target_config=model.config)[1][0]
    # labelled positions p = 2..6 (x_{p+1} is an answer token), read by step 0 at indices t = p - 1
    want = -(torch.softmax(out.logits[0, 2:7], -1) * torch.log_softmax(cap[0][1][0, 1:6], -1)).sum(-1).mean()
    assert capped == pytest.approx(float(want), rel=1e-5)
    assert abs(ttt_loss(*args)[1][0] - capped) > 1e-3


# -- SpecForge's Qwen3 head layout -----------------------------------------------------------------------------

def specforge_qwen3_checkpoint(d: Path, src, target_cfg) -> None:
    """`src` (a trained head) written as SpecForge writes a Qwen3 EAGLE-3 head: config.json with the keys
    of SpecForge's configs/qwen3-4b-eagle3.json (Qwen's sliding-window fields, tie_word_embeddings, token
    ids, a LlamaForCausalLMEagle3 architecture) and bf16 weights under the draft model's own names,
    embed_tokens included (SpecForge's draft model owns a copy of the target's embedding; the layout
    without it is tests/pipeline/models/test_head_formats.py's), d2t and t2d."""
    from safetensors.torch import save_file

    c = src.cfg
    d.mkdir(parents=True, exist_ok=True)
    sd = {k: v.detach().to(torch.bfloat16 if v.is_floating_point() else v.dtype).contiguous()
          for k, v in src.state_dict().items()}
    save_file(sd, str(d / "model.safetensors"))
    config = {"architectures": ["LlamaForCausalLMEagle3"], "attention_bias": False, "attention_dropout": 0.0,
              "bos_token_id": 0, "eos_token_id": VOCAB - 1, "head_dim": c.dim_head, "hidden_act": "silu",
              "hidden_size": c.hidden_size, "initializer_range": 0.02, "intermediate_size": c.intermediate_size,
              "max_position_embeddings": target_cfg.max_position_embeddings,
              "max_window_layers": target_cfg.num_hidden_layers, "model_type": "llama",
              "num_attention_heads": c.num_attention_heads, "num_hidden_layers": 1,
              "num_key_value_heads": c.num_key_value_heads, "rms_norm_eps": c.rms_norm_eps, "rope_scaling": None,
              "rope_theta": c.rope_theta, "sliding_window": None, "tie_word_embeddings": True,
              "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": True,
              "use_sliding_window": False, "vocab_size": c.vocab_size, "draft_vocab_size": c.draft_vocab_size}
    (d / "config.json").write_text(json.dumps(config, indent=2))


def test_specforge_qwen3_head_loads_and_drafts(tmp_path_factory):
    case = get_case("qwen3", tmp_path_factory)
    d = tmp_path_factory.mktemp("specforge-qwen3")
    specforge_qwen3_checkpoint(d, case.head, case.model.config)
    head = load_head(str(d), case.model)
    assert not head.shares_embedding                      # its own (bf16-rounded) copy of the target's embedding
    assert head.cfg.dim_head == 16 and head.layer_ids == (2, 3, 4) and head.dtype == torch.float32
    for k in ("fc.weight", "midlayer.self_attn.q_proj.weight", "lm_head.weight", "d2t", "t2d"):
        want = case.head.state_dict()[k]                   # the trained head's weights, rounded to bf16
        want = want.to(torch.bfloat16).to(want.dtype) if want.is_floating_point() else want
        assert torch.equal(head.state_dict()[k], want)
    eng = case.engine(head)
    taus = []
    for s in case.seqs[:3]:
        prompt = s.ids[: s.prompt_len]
        res = eng.generate(prompt, NEW, controller=StaticController(*SHAPE))
        assert res.output_ids == s.ids[s.prompt_len:]
        taus.append(res.tau)
    assert sum(taus) / len(taus) > 1.5, taus
