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


def test_bench_scale_writes_and_streams(tmp_path, capsys):
    import json

    from online.bench.scale import main

    common = ["--positions", "3000", "--logs", str(tmp_path / "logs"), "--max-positions", "1000"]
    r = {}
    for phase in ("write", "evaluate", "tune", "validate"):     # each phase as `make bench` runs it, in this process
        assert main(common + ["--phase", phase]) == 0
        line = [x for x in capsys.readouterr().out.splitlines() if x.startswith("SCALE_RESULT ")][-1]
        r[phase] = json.loads(line[len("SCALE_RESULT "):])
    assert r["write"]["positions"] >= 3000 and 0 < r["write"]["bytes_per_position"] < 3000
    assert r["evaluate"]["streamed"] and r["evaluate"]["positions"] == r["write"]["positions"]
    assert set(r["evaluate"]["tokens_per_s"]) == {"ar", "static", "grid-best", "oracle", "ddd", "entropy"}
    (first, _), (last, _) = r["tune"]["ranges"][0], r["tune"]["ranges"][-1]      # [batch range, shape] each
    assert first[0] == 1 and last[1] == 64
    v = r["validate"]              # 3,000 positions, a 1,000 budget: streamed (the 3 prompts' groups are all of them)
    assert v["streamed"] and v["prompts_read"]
    assert main(common[:-1] + ["100000", "--phase", "validate"]) == 0          # the logs fit: read whole
    line = [x for x in capsys.readouterr().out.splitlines() if x.startswith("SCALE_RESULT ")][-1]
    whole = json.loads(line[len("SCALE_RESULT "):])
    assert not whole["streamed"] and whole["grid_best"] == v["grid_best"]
