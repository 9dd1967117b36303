"""EAGLE-3 heads interchange with SafeAILab/EAGLE, SpecForge and SGLang: configs, RoPE scaling, the
SpecForge norm flags, strict keys, d2t/t2d, a shared (never allocated) embedding and the head dtype."""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from pipeline.decode.controller import StaticController
from pipeline.decode.engine.single import Engine
from pipeline.errors import DraftGymError, HeadMismatchError
from pipeline.models.head import (DEFAULT_HEAD_DIR, Eagle3Config, Eagle3Head, load_head, random_head, rope_cos_sin, save_head,
                           target_layer_ids)
from pipeline.models.head_model import Rope

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 16}
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128, "beta_fast": 32.0,
        "beta_slow": 1.0}
LINEAR = {"type": "linear", "factor": 2.0}            # the old key name `type` is accepted too
DYNAMIC = {"rope_type": "dynamic", "factor": 2.0}
SCALINGS = {"llama3": LLAMA3, "yarn": YARN, "linear": LINEAR, "dynamic": DYNAMIC}
OFFSET = 600  # positions past the tiny target's 512, so every scaling (dynamic too) is in play


def perturbed(head: Eagle3Head, seed: int = 1) -> Eagle3Head:
    """Make every norm weight non-trivial, so a weight that fails to load shows in the logits."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in head.named_parameters():
            if p.dim() == 1:
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
    return head


def head_logits(head: Eagle3Head, target, ids=(3, 9, 1, 7, 5, 2)) -> torch.Tensor:
    hs = target(torch.tensor([list(ids)]), output_hidden_states=True).hidden_states
    f = head.fuse(hs)
    n = len(ids) - 1
    return head(torch.tensor([list(ids[1:])]), f[:, :n], torch.arange(n) + OFFSET)[1]


def hf_cos_sin(cfg: Eagle3Config, rope_scaling: dict, pos: torch.Tensor):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    hf = LlamaConfig(hidden_size=cfg.hidden_size, num_attention_heads=cfg.num_attention_heads,
                     num_key_value_heads=cfg.num_key_value_heads, head_dim=cfg.dim_head,
                     max_position_embeddings=cfg.max_position_embeddings, rope_theta=cfg.rope_theta,
                     rope_scaling=dict(rope_scaling))
    cos, sin = LlamaRotaryEmbedding(hf)(torch.zeros(1), pos[None])
    return cos[0], sin[0]


# -- RoPE ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", list(SCALINGS))
def test_rope_scaling_matches_transformers(kind):
    cfg = Eagle3Config(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                       vocab_size=50, draft_vocab_size=50, max_position_embeddings=256, rope_theta=500000.0,
                       rope_scaling=SCALINGS[kind])
    for pos in (torch.arange(0, 40), torch.arange(200, 700, 7)):    # inside, and past, max_position_embeddings
        cos, sin = Rope(cfg).cos_sin(pos, torch.float32)
        want_cos, want_sin = hf_cos_sin(cfg, SCALINGS[kind], pos)
        torch.testing.assert_close(cos, want_cos, atol=1e-6, rtol=0)
        torch.testing.assert_close(sin, want_sin, atol=1e-6, rtol=0)
    if kind == "yarn":  # yarn's attention factor (mscale) multiplies cos and sin
        assert Rope(cfg).scale == pytest.approx(0.1 * torch.log(torch.tensor(4.0)).item() + 1)


def test_no_rope_scaling_is_plain_rope_bit_for_bit(tiny_llama):
    cfg = random_head(tiny_llama).cfg
    pos = torch.arange(OFFSET, OFFSET + 20)
    for a, b in zip(Rope(cfg).cos_sin(pos, torch.float32), rope_cos_sin(pos, cfg.dim_head, 10000.0, torch.float32)):
        assert torch.equal(a, b)
    for rp in ({"rope_type": "default", "rope_theta": 10000.0}, None):   # transformers 5 spelling / absent
        d = cfg.to_json() | {"rope_parameters": rp}
        assert Eagle3Config.from_json(d).rope_scaling is None


def test_rope_scaling_changes_the_logits(tiny_llama):
    plain = head_logits(random_head(tiny_llama, seed=3), tiny_llama)
    scaled = head_logits(random_head(tiny_llama, seed=3, rope_scaling=LLAMA3), tiny_llama)
    assert not torch.allclose(plain[0, 1:], scaled[0, 1:], atol=1e-6)


# -- round trips -----------------------------------------------------------------------------------

VARIANTS = {"plain": {}, "fc_norm": {"fc_norm": True}, "norm_output": {"norm_output": True},
            "lm_head_raw": {"lm_head_norm": False}, "both_flags": {"fc_norm": True, "norm_output": True}, "theta": {"rope_theta": 500000.0},
            **{k: {"rope_scaling": v} for k, v in SCALINGS.items()}}


@pytest.mark.parametrize("name", list(VARIANTS))
@pytest.mark.parametrize("draft_vocab", [24, None])
def test_save_load_roundtrip(tmp_path, tiny_llama, name, draft_vocab):
    head = perturbed(random_head(tiny_llama, draft_vocab_size=draft_vocab, seed=2, **VARIANTS[name]))
    save_head(head, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert cfg["fc_norm"] == head.cfg.fc_norm and cfg["norm_output"] == head.cfg.norm_output
    assert cfg.get("lm_head_norm", True) == head.cfg.lm_head_norm and cfg["draftgym_head_format"] == 2
    assert cfg.get("rope_scaling") == head.cfg.rope_scaling and cfg["torch_dtype"] == "float32"
    sd = load_file(str(tmp_path / "model.safetensors"))
    assert "embed_tokens.weight" not in sd
    assert ("fc_norm.0.weight" in sd) == head.cfg.fc_norm
    if draft_vocab is None:   # SGLang needs the mapping even when it is the identity
        assert not sd["d2t"].any() and bool(sd["t2d"].all()) and sd["t2d"].shape == (64,)
    again = load_head(str(tmp_path), tiny_llama)
    assert again.cfg == head.cfg
    assert torch.equal(head_logits(head, tiny_llama), head_logits(again, tiny_llama))


def test_own_embedding_roundtrip(tmp_path, tiny_llama):
    """A head wider than its target (target_hidden_size) ships and reloads its own embed_tokens."""
    cfg = Eagle3Config(hidden_size=48, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
                       vocab_size=64, draft_vocab_size=20, target_hidden_size=32, fc_norm=True)
    head = perturbed(Eagle3Head(cfg, target_layer_ids(4)))
    with torch.no_grad():
        for n, p in head.named_parameters():
            if p.dim() == 2:
                p.normal_(0, 0.05)
    save_head(head, tmp_path)
    assert load_file(str(tmp_path / "model.safetensors"))["embed_tokens.weight"].shape == (64, 48)
    again = load_head(str(tmp_path), tiny_llama)
    assert not again.shares_embedding and torch.equal(again.embed_tokens.weight, head.embed_tokens.weight)
    assert torch.equal(head_logits(head, tiny_llama), head_logits(again, tiny_llama))


# -- SpecForge-style checkpoints -----------------------------------------------------------------------

def specforge_checkpoint(d, target, rope_scaling=None, fc_norm=True, norm_output=True, extra_keys=None):
    """A head laid out as SpecForge writes one (configs/*-eagle3*.json): architectures
    LlamaForCausalLMEagle3, its flags, bf16 weights and d2t/t2d. Returns the source head (fp32)."""
    head = perturbed(random_head(target, draft_vocab_size=24, seed=4, fc_norm=fc_norm, norm_output=norm_output))
    sd = {k: (v.to(torch.bfloat16) if v.is_floating_point() else v).contiguous()
          for k, v in head.state_dict().items() if k != "embed_tokens.weight"}
    save_file(sd | (extra_keys or {}), str(d / "model.safetensors"))
    c = head.cfg
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "attention_bias": False, "fc_norm": fc_norm,
           "head_dim": c.dim_head, "hidden_act": "silu", "hidden_size": c.hidden_size, "initializer_range": 0.02,
           "intermediate_size": c.intermediate_size, "max_position_embeddings": 512, "model_type": "llama",
           "norm_output": norm_output, "num_attention_heads": c.num_attention_heads, "num_hidden_layers": 1,
           "num_key_value_heads": c.num_key_value_heads, "rms_norm_eps": 1e-6, "rope_scaling": rope_scaling,
           "rope_theta": 10000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
           "transformers_version": "4.53.2", "use_cache": True, "vocab_size": c.vocab_size, "draft_vocab_size": 24}
    (d / "config.json").write_text(json.dumps(cfg))
    return head


@pytest.mark.parametrize("kind", [None, *SCALINGS])
def test_specforge_config_loads(tmp_path, tiny_llama, kind):
    rs = SCALINGS.get(kind)
    specforge_checkpoint(tmp_path, tiny_llama, rope_scaling=rs, fc_norm=True, norm_output=kind != "yarn")
    head = load_head(str(tmp_path), tiny_llama)
    assert head.cfg.fc_norm and head.cfg.norm_output == (kind != "yarn")
    assert (head.cfg.rope_scaling or {}).get("rope_type") == (None if rs is None else rs.get("rope_type", rs.get("type")))
    if rs is not None:
        pos = torch.arange(OFFSET, OFFSET + 9)
        torch.testing.assert_close(head.rope.cos_sin(pos, torch.float32)[0], hf_cos_sin(head.cfg, rs, pos)[0],
                                   atol=1e-6, rtol=0)
    # fc_norm: each third is RMS-normalised with its own weight before fc, as SpecForge's project_hidden_states
    hs = tiny_llama(torch.tensor([[5, 6, 7]]), output_hidden_states=True).hidden_states
    want = torch.cat([F.rms_norm(hs[i], (32,), eps=1e-6) * head.fc_norm[j].weight
                      for j, i in enumerate(head.layer_ids)], -1) @ head.fc.weight.T
    torch.testing.assert_close(head.fuse(hs), want)
    g, logits, _ = head(torch.tensor([[6, 7]]), head.fuse(hs)[:, :2], torch.arange(2))
    lm_in = g if head.cfg.norm_output else head.norm(g)    # norm_output = true: forward returns norm(g'') already
    torch.testing.assert_close(logits, lm_in @ head.lm_head.weight.T)
    if kind == "llama3":
        eng = Engine(tiny_llama, head)
        assert eng.generate([1, 2, 3], 16, controller=StaticController(4, 3, 12)).output_ids == \
            eng.generate_ar([1, 2, 3], 16).output_ids


def midlayer_out(head, tiny_llama):
    """g'' of a 2-token draft forward, computed outside `forward`, and the forward's (state, logits)."""
    hs = tiny_llama(torch.tensor([[5, 6, 7]]), output_hidden_states=True).hidden_states
    f, ids, pos = head.fuse(hs)[:, :2], torch.tensor([[6, 7]]), torch.arange(2)
    cos, sin = head.rope.cos_sin(pos, f.dtype)
    g, _ = head.midlayer(head.embed_tokens(ids), f, cos, sin, None, None)
    s, logits, _ = head(ids, f, pos)
    return g, s, logits


@pytest.mark.parametrize("norm_output", [False, True])
def test_norm_output_means_what_the_engines_mean(tiny_llama, norm_output):
    """vLLM 0.32 (llama_eagle3.py), SGLang and SpecForge since PR #879: lm_head always reads norm(g''); norm_output
    says whether the next draft step reads norm(g'') (EAGLE-3.1) or g'' (EAGLE-3)."""
    head = perturbed(random_head(tiny_llama, draft_vocab_size=24, seed=5, norm_output=norm_output))
    g, s, logits = midlayer_out(head, tiny_llama)
    torch.testing.assert_close(s, head.norm(g) if norm_output else g)
    torch.testing.assert_close(logits, head.norm(g) @ head.lm_head.weight.T)
    raw = perturbed(random_head(tiny_llama, draft_vocab_size=24, seed=5, lm_head_norm=False))
    g, s, logits = midlayer_out(raw, tiny_llama)
    torch.testing.assert_close(s, g)
    torch.testing.assert_close(logits, g @ raw.lm_head.weight.T)


@pytest.mark.parametrize("old_flag", [True, False])
def test_legacy_draftgym_head_reads_as_trained_and_converts(tmp_path, tiny_llama, capsys, old_flag):
    """A DraftGym head from before draftgym_head_format 2 (a manifest.json, no format key): its norm_output meant
    lm_head_norm. It loads as trained, says so in one line, and head-convert rewrites config.json only."""
    from pipeline.models.head import HeadConvertConfig, run_head_convert_command

    head = perturbed(random_head(tiny_llama, draft_vocab_size=24, seed=6, lm_head_norm=old_flag))
    save_head(head, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg.pop("draftgym_head_format"), cfg.pop("lm_head_norm", None)
    cfg["norm_output"] = old_flag
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "manifest.json").write_text("{}")
    weights = (tmp_path / "model.safetensors").read_bytes()
    old = load_head(str(tmp_path), tiny_llama)
    assert "before draftgym_head_format 2" in capsys.readouterr().err
    assert old.cfg.lm_head_norm == old_flag and not old.cfg.norm_output
    assert torch.equal(head_logits(old, tiny_llama), head_logits(head, tiny_llama))
    assert run_head_convert_command(HeadConvertConfig(head=str(tmp_path))) == 0
    assert "rewrote" in capsys.readouterr().out
    new = json.loads((tmp_path / "config.json").read_text())
    assert new["draftgym_head_format"] == 2 and new["norm_output"] is False
    assert new.get("lm_head_norm", True) == old_flag and (tmp_path / "model.safetensors").read_bytes() == weights
    again = load_head(str(tmp_path), tiny_llama)
    assert "before draftgym_head_format" not in capsys.readouterr().err
    assert torch.equal(head_logits(again, tiny_llama), head_logits(head, tiny_llama))


def test_shipped_head_is_written_for_the_engines():
    cfg = json.loads((DEFAULT_HEAD_DIR / "config.json").read_text())
    assert cfg["draftgym_head_format"] == 2 and cfg["norm_output"] is False and "lm_head_norm" not in cfg


def test_rope_parameters_spelling(tmp_path, tiny_llama):
    """transformers 5 writes rope_theta and the scaling together as rope_parameters."""
    specforge_checkpoint(tmp_path, tiny_llama)
    cfg = json.loads((tmp_path / "config.json").read_text())
    del cfg["rope_scaling"], cfg["rope_theta"]
    cfg["rope_parameters"] = {"rope_theta": 50000.0, **LLAMA3}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    head = load_head(str(tmp_path), tiny_llama)
    assert head.cfg.rope_theta == 50000.0 and head.cfg.rope_scaling == LLAMA3


# -- one-line errors ------------------------------------------------------------------------------------

def one_line(excinfo) -> str:
    msg = str(excinfo.value)
    assert "\n" not in msg
    return msg


def test_unknown_weight_is_one_line_error(tmp_path, tiny_llama):
    specforge_checkpoint(tmp_path, tiny_llama, extra_keys={"foo.weight": torch.zeros(3)})
    with pytest.raises(HeadMismatchError) as e:
        load_head(str(tmp_path), tiny_llama)
    assert "unknown weight 'foo.weight'" in one_line(e)


def test_fc_norm_weights_without_the_flag_are_unknown(tmp_path, tiny_llama):
    specforge_checkpoint(tmp_path, tiny_llama)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(cfg | {"fc_norm": False}))
    with pytest.raises(HeadMismatchError, match="unknown weight 'fc_norm.0.weight'"):
        load_head(str(tmp_path), tiny_llama)


def test_harmless_keys_are_ignored(tmp_path, tiny_llama):
    src = specforge_checkpoint(tmp_path, tiny_llama, extra_keys={"model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(4)})
    head = load_head(str(tmp_path), tiny_llama)
    torch.testing.assert_close(head.fc.weight, src.fc.weight.to(torch.bfloat16).float())


@pytest.mark.parametrize("change,match", [
    ({"rope_scaling": {"type": "mrope", "mrope_section": [1, 1, 2]}}, "rope type 'mrope' is not supported"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "rope_scaling .* is not usable"),
    ({"rope_scaling": {"factor": 8.0}}, "names no rope_type"),
    ({"rope_scaling": "llama3"}, "must be a JSON object"),
    ({"architectures": ["Qwen2ForCausalLM"]}, "not an EAGLE-3 Llama head"),
    ({"fc_norm": "yes"}, "fc_norm must be true or false"),
])
def test_broken_config_is_one_line_error(tmp_path, tiny_llama, change, match):
    specforge_checkpoint(tmp_path, tiny_llama)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(cfg | change))
    with pytest.raises(DraftGymError, match=match) as e:
        load_head(str(tmp_path), tiny_llama)
    one_line(e)


# -- the embedding is the target's, never a random [vocab, H] tensor ---------------------------------------

def test_shared_embedding_is_never_allocated(tmp_path, tiny_llama, monkeypatch):
    cfg = random_head(tiny_llama).cfg
    head = Eagle3Head(cfg, (2, 2, 1), share_embedding=True)
    assert "embed_tokens.weight" not in dict(head.named_parameters()) and head.embed_tokens.weight is None
    with pytest.raises(DraftGymError, match="attach_target_embeddings"):
        head(torch.tensor([[1]]), torch.zeros(1, 1, 32), torch.arange(1))
    save_head(random_head(tiny_llama, draft_vocab_size=24), tmp_path)
    made = []   # every [vocab, H] embedding weight initialised off the meta device
    orig = torch.nn.Embedding.reset_parameters
    monkeypatch.setattr(torch.nn.Embedding, "reset_parameters",
                        lambda self: (made.append(self.weight.device.type) if self.weight.device.type != "meta" else None,
                                      orig(self)))
    loaded = load_head(str(tmp_path), tiny_llama)
    random_head(tiny_llama)
    assert made == []
    emb = tiny_llama.get_input_embeddings().weight
    assert loaded.embed_tokens.weight.untyped_storage().data_ptr() == emb.untyped_storage().data_ptr()


# -- dtype ----------------------------------------------------------------------------------------------

def fp16_checkpoint(d, target):
    head = perturbed(random_head(target, draft_vocab_size=24, seed=6)).to(torch.float16)
    save_head(head, d)
    return head


def test_fp16_checkpoint_stays_fp16_with_a_bf16_target(tmp_path):
    from tests.conftest import make_tiny_llama

    target = make_tiny_llama().to(torch.bfloat16)
    fp16_checkpoint(tmp_path, make_tiny_llama())
    head = load_head(str(tmp_path), target)
    assert head.fc.weight.dtype == torch.float16 and head.dtype == torch.float16
    assert head.embed_tokens.weight.data_ptr() == target.get_input_embeddings().weight.data_ptr()   # bf16, shared
    res = Engine(target, head).generate([1, 2, 3], 12, controller=StaticController(3, 3, 8))
    assert len(res.output_ids) == 12 and res.cycles and res.tau >= 1
    assert load_head(str(tmp_path), target, dtype="bfloat16").fc.weight.dtype == torch.bfloat16


def test_fp32_target_upcasts_any_checkpoint(tmp_path, tiny_llama):
    from tests.conftest import make_tiny_llama

    fp16_checkpoint(tmp_path / "a", make_tiny_llama())
    save_head(random_head(make_tiny_llama().to(torch.bfloat16), draft_vocab_size=24), tmp_path / "b")
    for d in ("a", "b"):
        head = load_head(str(tmp_path / d), tiny_llama)
        assert all(p.dtype == torch.float32 for p in head.parameters())
    # a bf16 checkpoint beside a bf16 target, and fp32 weights beside a bf16 target: the target's dtype
    bf16_target = make_tiny_llama().to(torch.bfloat16)
    assert load_head(str(tmp_path / "b"), bf16_target).dtype == torch.bfloat16
    save_head(random_head(tiny_llama, draft_vocab_size=24), tmp_path / "c")
    assert load_head(str(tmp_path / "c"), bf16_target).dtype == torch.bfloat16
    with pytest.raises(DraftGymError, match="unknown head dtype"):
        load_head(str(tmp_path / "c"), bf16_target, dtype="int8")
