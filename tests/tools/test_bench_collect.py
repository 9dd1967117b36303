"""tools.bench.collect: the collection benchmark runs end to end at a tiny size, and its --warm
re-collection reuses the continuations of a scratch cache without touching the user's."""
from __future__ import annotations

import json
import os

from tools.bench import collect as bench_collect


def test_bench_collect_cold_and_warm(tmp_path, monkeypatch):
    from pipeline.runtime.cache import cache_dir

    user_cache = tmp_path / "user-cache"
    user_cache.mkdir()
    if (cache_dir() / "models").is_dir():             # the converted embedded model, not converted again
        (user_cache / "models").symlink_to((cache_dir() / "models").resolve(), target_is_directory=True)
    monkeypatch.setenv("DRAFTGYM_CACHE", str(user_cache))
    out = tmp_path / "bench.json"
    assert bench_collect.main(["--dataset", "mt-bench", "--split", "test", "--n-prompts", "2", "--max-new-tokens", "6",
                               "--online-trees", "2,2,3", "--prompt-batches", "2", "--dtypes", "float32",
                               "--warm", "--bracket", "--out", str(out)]) == 0
    rep = json.loads(out.read_text())
    cold, warm_run = rep["runs"][0]["collection"]
    assert (cold["warm"], warm_run["warm"]) == (False, True)
    # the same prompts give the same positions, whether the continuations were generated or read back
    assert cold["positions"] == warm_run["positions"] > 0 and cold["prompts"] == warm_run["prompts"] == 2
    assert warm_run["ratio"].keys() == {"2,2,3"}
    on = rep["runs"][0]["online"][0]                  # --bracket: two online passes, the ratio over both
    assert len(on["passes_tokens_per_s"]) == 2 and on["tokens_per_s"] == on["tokens"] / on["wall_s"]
    assert min(on["passes_tokens_per_s"]) <= on["tokens_per_s"] <= max(on["passes_tokens_per_s"])
    assert warm_run["ratio"]["2,2,3"] == warm_run["positions_per_s"] / on["tokens_per_s"]
    assert "before," in rep["table"]
    assert "continuations cached" in rep["table"]
    # the scratch cache was used and removed; the user's cache holds no continuations from the benchmark
    assert not (user_cache / "continuations").exists()
    assert os.environ["DRAFTGYM_CACHE"] == str(user_cache)
