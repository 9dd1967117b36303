"""Shared fixtures: tiny random Llama targets (fast) and the embedded default target (slow, cached)."""
from __future__ import annotations

import os

import pytest
import torch

# The suite runs the same on every CPU: the default dtype is pinned to fp32 (the strict, exact path);
# tests of reduced precision ask for bf16 explicitly. (The machine-dependent default is
# pipeline.models.target.default_cpu_dtype, tested in tests/pipeline/models/test_dtype.py.)
os.environ["DRAFTGYM_CPU_DTYPE"] = "float32"

# `make test` runs the suite on pytest-xdist workers, a file per worker at a time (Makefile TEST_WORKERS,
# one per core on CI's 2-core box): each worker takes its share of the cores for torch's intra-op
# threads, so the workers do not oversubscribe them.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))

# The files that take 8 s or more on the 2-core box, longest first (a serial run's --durations).
# With --no-loadscope-reorder (Makefile) xdist hands the files out in collection order, the next one to
# a worker whose queue runs low, so the long ones start first and the end of the queue is short files:
# no worker is left alone with a long one at the end (longest-processing-time-first scheduling). The
# files not named follow, as collected.
LONGEST_FIRST = ("test_vllm.py", "test_lossless.py", "test_demo.py", "test_dtype.py", "test_sampling.py", "test_collect_job.py",
                 "test_collect.py", "test_validate.py", "test_cluster.py", "test_transfer.py", "test_engine.py", "test_validate_batch.py",
                 "test_generate_cli.py",
                 "test_batch_engine.py", "test_smollm2.py", "test_notebook_sim_vs_real.py", "test_no_deprecations.py",
                 "test_architectures.py", "test_serving_plots.py", "test_reanchor.py", "test_train_draft.py",
                 "test_gpu_check.py", "test_chooser_adapter_learned.py", "test_obs_rich.py", "test_bench_collect.py",
                 "test_serving_load_methods.py", "test_profile.py", "test_batch_generate.py", "test_query.py",
                 "test_sim_train.py", "test_sim_online_parity.py", "test_sim_collector_logs.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda it: rank.get(it.path.name, len(rank)))        # stable: the rest keep their order


def make_tiny_llama(vocab: int = 64, hidden: int = 32, layers: int = 4, heads: int = 4, kv_heads: int = 2,
                    seed: int = 0, max_positions: int = 512):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=max_positions,
                      bos_token_id=None, eos_token_id=None, pad_token_id=None)
    model = LlamaForCausalLM(cfg).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


@pytest.fixture(scope="session")
def tiny_llama():
    return make_tiny_llama()


@pytest.fixture(scope="session")
def smollm2():
    """The embedded default target (dequantised once into the user cache, then ~5 s to load)."""
    from pipeline.models.target import load_target

    return load_target("smollm2-135m", device="cpu")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny random Llama with SmolLM2's tokenizer, saved as a HF model directory (vocab 49152, hidden 16),
    so the model-loading code paths (load_target by path, chat template) run in seconds."""
    from transformers import AutoTokenizer

    from pipeline.models.target import _materialise_smollm2

    d = tmp_path_factory.mktemp("tiny-llama")
    model = make_tiny_llama(vocab=49152, hidden=16, layers=4, heads=2, kv_heads=1, max_positions=2048)
    model.config.eos_token_id = 2
    model.save_pretrained(d)
    AutoTokenizer.from_pretrained(_materialise_smollm2()).save_pretrained(d)
    return d


def build_tiny_logs(logs, model_dir, n_prompts: int):
    """Logs a `draftgym validate` can use, on the tiny target: MT-bench test + train collections
    (random head, 16 new tokens, W = 10) and a small latency profile. Returns `logs`."""
    from online.cli import main as cli
    from pipeline.collect.prompt import CollectConfig
    from pipeline.collect.job import run_collect

    for split in ("test", "train"):
        cfg = CollectConfig(model=str(model_dir), head="random", dataset="mt-bench", split=split, n_prompts=n_prompts,
                            max_new_tokens=16, widths=(10,), max_depth=12)
        run_collect(cfg, logs, use_ray=False, progress=False)
    assert cli(["profile", "--model", str(model_dir), "--head", "random", "--verify-sizes", "1,8,60,240",
                "--contexts", "64,256", "--repeats", "2", "--out", str(logs)]) == 0
    return logs
