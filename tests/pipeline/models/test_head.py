"""EAGLE-3 head: the official checkpoint format loads, and heads that do not fit their target fail clearly."""
from __future__ import annotations

import json

import pytest
import torch

from pipeline.decode.controller import StaticController
from pipeline.decode.engine.single import Engine
from pipeline.errors import DraftGymError, HeadMismatchError
from pipeline.models.head import Eagle3Config, Eagle3Head, load_head, random_head, save_head, target_layer_ids

OFFICIAL_KEYS = [
    "fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d",
    "midlayer.self_attn.q_proj.weight", "midlayer.self_attn.k_proj.weight",
    "midlayer.self_attn.v_proj.weight", "midlayer.self_attn.o_proj.weight",
    "midlayer.mlp.gate_proj.weight", "midlayer.mlp.up_proj.weight", "midlayer.mlp.down_proj.weight",
    "midlayer.hidden_norm.weight", "midlayer.input_layernorm.weight", "midlayer.post_attention_layernorm.weight",
]


def official_checkpoint(tmp_path, target, hidden=32, draft_vocab=24, fmt="bin", prefix="", seed=0):
    """Write a head the way SafeAILab/EAGLE releases them: config.json + weights with the official
    key names, a d2t/t2d vocabulary mapping, no embed_tokens. Returns (dir, raw tensors)."""
    g = torch.Generator().manual_seed(seed)
    vocab, H_t = target.config.vocab_size, target.config.hidden_size
    nh, nkv, inter = 4, 2, 80
    d = hidden // nh
    shapes = {
        "fc.weight": (hidden, 3 * H_t), "norm.weight": (hidden,), "lm_head.weight": (draft_vocab, hidden),
        "midlayer.self_attn.q_proj.weight": (nh * d, 2 * hidden),
        "midlayer.self_attn.k_proj.weight": (nkv * d, 2 * hidden),
        "midlayer.self_attn.v_proj.weight": (nkv * d, 2 * hidden),
        "midlayer.self_attn.o_proj.weight": (hidden, nh * d),
        "midlayer.mlp.gate_proj.weight": (inter, hidden), "midlayer.mlp.up_proj.weight": (inter, hidden),
        "midlayer.mlp.down_proj.weight": (hidden, inter),
        "midlayer.hidden_norm.weight": (hidden,), "midlayer.input_layernorm.weight": (hidden,),
        "midlayer.post_attention_layernorm.weight": (hidden,),
    }
    sd = {k: (1 + 0.1 * torch.randn(s, generator=g)) if len(s) == 1 else 0.05 * torch.randn(s, generator=g)
          for k, s in shapes.items()}
    draft_ids = torch.randperm(vocab, generator=g)[:draft_vocab].sort().values   # the chosen draft vocabulary
    sd["d2t"] = draft_ids - torch.arange(draft_vocab)                            # target_id = i + d2t[i]
    sd["t2d"] = torch.zeros(vocab, dtype=torch.bool)
    sd["t2d"][draft_ids] = True
    cfg = {"architectures": ["LlamaForCausalLM"], "hidden_size": hidden, "intermediate_size": inter,
           "num_attention_heads": nh, "num_key_value_heads": nkv, "num_hidden_layers": 1, "vocab_size": vocab,
           "draft_vocab_size": draft_vocab, "rms_norm_eps": 1e-6, "max_position_embeddings": 2048,
           "torch_dtype": "bfloat16", "hidden_act": "silu", "model_type": "llama", "bos_token_id": 0}
    if hidden != H_t:
        cfg["target_hidden_size"] = H_t
        sd["embed_tokens.weight"] = 0.05 * torch.randn(vocab, hidden, generator=g)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    files = {f"{prefix}{k}": v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in sd.items()}
    if fmt == "bin":
        torch.save(files, tmp_path / "pytorch_model.bin")
    else:
        from safetensors.torch import save_file
        save_file(files, str(tmp_path / "model.safetensors"))
    return tmp_path, sd


@pytest.mark.parametrize("fmt,prefix", [("bin", ""), ("safetensors", ""), ("safetensors", "model.")])
def test_official_checkpoint_loads(tmp_path, tiny_llama, fmt, prefix):
    ckpt, sd = official_checkpoint(tmp_path, tiny_llama, fmt=fmt, prefix=prefix)
    head = load_head(str(ckpt), tiny_llama)
    assert set(OFFICIAL_KEYS) <= set(head.state_dict())
    for k in OFFICIAL_KEYS:  # every official tensor landed in the right place (bf16 on disk -> fp32 here)
        want = sd[k].to(torch.bfloat16).float() if sd[k].is_floating_point() else sd[k]
        assert torch.equal(head.state_dict()[k].to(want.dtype), want), k
    # embeddings come from the target; the fused layers are 2, L//2, L-3
    assert head.embed_tokens.weight.data_ptr() == tiny_llama.get_input_embeddings().weight.data_ptr()
    assert head.layer_ids == target_layer_ids(4) == (2, 2, 1)
    # draft ids map to target ids through d2t
    ids = torch.arange(24)
    mapped = head.draft_to_target(ids)
    assert torch.equal(mapped, ids + sd["d2t"]) and bool(sd["t2d"][mapped].all())
    # and it drafts losslessly
    eng = Engine(tiny_llama, head)
    assert eng.generate([1, 2, 3], 20, controller=StaticController(4, 3, 12)).output_ids == \
        eng.generate_ar([1, 2, 3], 20).output_ids


def test_head_with_own_hidden_size_and_embeddings(tmp_path, tiny_llama):
    """target_hidden_size set: the head is wider than the target and ships its own embed_tokens."""
    ckpt, sd = official_checkpoint(tmp_path, tiny_llama, hidden=48)
    head = load_head(str(ckpt), tiny_llama)
    assert head.cfg.hidden_size == 48 and head.cfg.target_hidden_size == 32
    assert torch.equal(head.embed_tokens.weight, sd["embed_tokens.weight"].to(torch.bfloat16).float())
    eng = Engine(tiny_llama, head)
    assert eng.generate([7, 8], 16, controller=StaticController(3, 4, 10)).output_ids == \
        eng.generate_ar([7, 8], 16).output_ids


def test_save_load_roundtrip(tmp_path, tiny_llama):
    head = random_head(tiny_llama, draft_vocab_size=30, seed=5)
    save_head(head, tmp_path)
    again = load_head(str(tmp_path), tiny_llama)
    x = torch.tensor([[1, 2, 3]])
    h = torch.randn(1, 3, 32)
    torch.testing.assert_close(head(x, h, torch.arange(3))[1], again(x, h, torch.arange(3))[1])
    assert "embed_tokens.weight" not in __import__("safetensors.torch").torch.load_file(str(tmp_path / "model.safetensors"))


def test_wrong_hidden_size_is_a_clear_error(tmp_path):
    from tests.conftest import make_tiny_llama

    other = make_tiny_llama(hidden=48, heads=4, kv_heads=2)       # the head was built for hidden 48
    ckpt, _ = official_checkpoint(tmp_path, other, hidden=48)
    target = make_tiny_llama(hidden=32)
    with pytest.raises(HeadMismatchError) as e:
        load_head(str(ckpt), target)
    msg = str(e.value)
    assert "\n" not in msg and "hidden size is 32" in msg and "3 x 48" in msg


def test_wrong_vocab_is_a_clear_error(tmp_path, tiny_llama):
    from tests.conftest import make_tiny_llama

    ckpt, _ = official_checkpoint(tmp_path, make_tiny_llama(vocab=100), draft_vocab=24)
    with pytest.raises(HeadMismatchError, match="vocab_size 100 != target vocabulary 64"):
        load_head(str(ckpt), tiny_llama)


def test_bad_head_paths_and_files(tmp_path, tiny_llama):
    with pytest.raises(DraftGymError, match="not found"):
        load_head(str(tmp_path / "nope"), tiny_llama)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DraftGymError, match="no config.json"):
        load_head(str(tmp_path / "empty"), tiny_llama)
    ckpt, _ = official_checkpoint(tmp_path / "empty", tiny_llama, fmt="safetensors")
    raw = (ckpt / "model.safetensors").read_bytes()
    (ckpt / "model.safetensors").write_bytes(raw[: len(raw) // 2])            # truncated download
    with pytest.raises(DraftGymError, match="cannot read head weights"):
        load_head(str(ckpt), tiny_llama)
    (ckpt / "model.safetensors").unlink()
    sd = {"fc.weight": torch.zeros(32, 96)}
    torch.save(sd, ckpt / "pytorch_model.bin")
    with pytest.raises(HeadMismatchError, match="lacks 12 keys"):
        load_head(str(ckpt), tiny_llama)


def test_config_from_official_json_defaults():
    cfg = Eagle3Config.from_json({"hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
                                  "num_key_value_heads": 8, "vocab_size": 128256, "draft_vocab_size": 32000,
                                  "rms_norm_eps": 1e-5, "max_position_embeddings": 2048})
    assert cfg.rope_theta == 10000.0 and cfg.dim_head == 128 and cfg.fused_size == 3 * 4096
    head = Eagle3Head(Eagle3Config(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=50, draft_vocab_size=20), (2, 4, 5))
    assert head.lm_head.weight.shape == (20, 64) and head.fc.weight.shape == (64, 192)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gqa_attention_equals_repeated_keys(dtype):
    """The head's grouped-query attention (query heads folded onto their kv head, no repeat) equals
    SDPA over repeat_interleave'd keys, for the masks the project uses: causal [q, K], per-root
    [B, 1, q, K] with -inf holes; a per-head mask takes the repeat path and agrees too.

    Bit for bit where the CPU's SDPA kernel does not depend on the number of query rows (the Intel
    Xeon, and bf16 everywhere seen); on an AMD EPYC (Zen 4) fp32 differs by 1 ulp in
    ~5 % of entries, because folding makes rep*q rows instead of q. The bound is 4 ulps of the largest
    output: a wrong kv-head mapping or mask moves outputs by O(1) (checked below), far above it."""
    import torch.nn.functional as F
    from pipeline.models.head_model import causal_mask, gqa_attention

    g = torch.Generator().manual_seed(0)
    B, nkv, rep, q, K, d = 3, 2, 3, 5, 17, 8
    qs = torch.randn(B, nkv * rep, q, d, generator=g).to(dtype)
    ks, vs = (torch.randn(B, nkv, K, d, generator=g).to(dtype) for _ in range(2))
    holes = torch.zeros(B, 1, q, K, dtype=dtype).masked_fill_(torch.rand(B, 1, q, K, generator=g) < 0.3, float("-inf"))
    holes[..., 0] = 0
    per_head = holes.expand(B, nkv * rep, q, K).clone()
    per_head[:, 1, :, 1] = float("-inf")
    for mask in (causal_mask(q, K - q, "cpu", dtype), holes, per_head):
        ref = F.scaled_dot_product_attention(qs, ks.repeat_interleave(rep, 1), vs.repeat_interleave(rep, 1),
                                             attn_mask=mask)
        out = gqa_attention(qs, ks, vs, mask)
        torch.testing.assert_close(out, ref, rtol=0, atol=4 * torch.finfo(dtype).eps * ref.abs().max().item())
    wrong = F.scaled_dot_product_attention(qs, ks.repeat(1, rep, 1, 1), vs.repeat(1, rep, 1, 1), attn_mask=holes)
    assert (gqa_attention(qs, ks, vs, holes) - wrong).abs().max() > 0.1  # repeat (not interleave) is a bug the bound sees


def test_kv_buffer_forward_equals_concatenated_past(tiny_llama):
    """A head forward over a KVBuffer (prefix copied once, entries written in place) equals one over
    the concatenated [prefix | new] past, and the buffer then holds exactly that concatenation."""
    from pipeline.models.head_model import KVBuffer

    head = random_head(tiny_llama, seed=3)
    cfg, g = head.cfg, torch.Generator().manual_seed(1)
    B, S, W = 2, 6, 3
    pk, pv = (torch.randn(1, cfg.num_key_value_heads, S, cfg.dim_head, generator=g) for _ in range(2))
    toks = torch.randint(0, cfg.vocab_size, (B, W), generator=g)
    hidden = torch.randn(B, W, cfg.hidden_size, generator=g)
    mask = torch.zeros(B, 1, W, S + W)
    with torch.inference_mode():
        buf = KVBuffer((pk, pv), B, 2 * W)
        a = head(toks, hidden, torch.full((B, W), S), past_kv=buf, attn_mask=mask)
        b = head(toks, hidden, torch.full((B, W), S), past_kv=(pk.expand(B, -1, -1, -1), pv.expand(B, -1, -1, -1)),
                 attn_mask=mask)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert buf.length == S + W and torch.equal(buf.keys[:, :, :S], pk.expand(B, -1, -1, -1))
    assert torch.equal(buf.keys[:, :, S : S + W], b[2][0])


def test_head_report_leaves_the_shipped_head_unchanged(tmp_path, monkeypatch, capsys):
    """`draftgym head-report --head default` writes its plot under data/reports/head-report/ (here below
    a scratch working directory), never into the shipped head's directory, and prints every run's head
    name whole, however long (its column fits the names)."""
    import hashlib

    from online.cli import main
    from pipeline.models.head import resolve_head_dir

    head = resolve_head_dir("default")

    def snapshot():
        return {p.name: (p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest()) for p in head.iterdir()}

    before = snapshot()
    monkeypatch.chdir(tmp_path)
    assert main(["head-report", "--head", "default"]) == 0
    printed = capsys.readouterr().out
    assert snapshot() == before
    png = tmp_path / "data" / "reports" / "head-report" / f"{head.name}.png"
    assert png.stat().st_size > 1000 and f"plot: {png.relative_to(tmp_path)}" in printed
    names = [r["head"] for r in json.loads((head / "manifest.json").read_text())["lineage"]] + ["default"]
    w = max(map(len, names))
    table = [ln for ln in printed.splitlines() if ln[:3].strip().isdigit()]
    assert len(names) > 1 and [ln[5:5 + w].rstrip() for ln in table] == names     # whole names, one column
