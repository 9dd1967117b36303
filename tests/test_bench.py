"""`make bench` (python -m online.bench): runs the chosen benchmarks and prints one summary table."""
from online.bench.__main__ import BenchConfig, run


def test_bench_env_writes_a_summary(tmp_path, capsys):
    assert run(BenchConfig(only="env", out=str(tmp_path))) == 0
    summary = (tmp_path / "summary.md").read_text()
    assert "| env | replay env depth/1024: steps/s |" in summary
    assert "| env | replay env shape/1024: steps/s |" in summary
    assert (tmp_path / "env.json").is_file()


def test_bench_refuses_an_unknown_name(tmp_path, capsys):
    assert run(BenchConfig(only="env,nope", out=str(tmp_path))) == 2
    assert "unknown benchmark(s) ['nope']" in capsys.readouterr().err
    assert not (tmp_path / "summary.md").exists()


def test_bench_scale_writes_and_streams(tmp_path):
    import json

    from online.bench.scale import main

    out = tmp_path / "scale.json"
    argv = ["--positions", "3000", "--logs", str(tmp_path / "logs"), "--phases", "write,evaluate",
            "--max-positions", "1000", "--out", str(out)]
    assert main(argv) == 0
    r = {x["phase"]: x for x in json.loads(out.read_text())["results"]}
    assert r["write"]["positions"] >= 3000 and 0 < r["write"]["bytes_per_position"] < 3000
    assert r["evaluate"]["streamed"] and r["evaluate"]["positions"] == r["write"]["positions"]
    assert set(r["evaluate"]["tokens_per_s"]) == {"ar", "static", "grid-best", "oracle", "ddd", "entropy"}
