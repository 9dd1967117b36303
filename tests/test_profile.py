"""`draftgym profile` writes checked latency rows for every op."""
from __future__ import annotations

import json

from online.cli import main as cli
from pipeline.schema import read_table, table_files


def test_profile_tiny(tmp_path, tiny_model_dir, capsys):
    rc = cli(["profile", "--model", str(tiny_model_dir), "--head", "random", "--widths", "2,4",
              "--verify-sizes", "1,8,32", "--contexts", "16,64", "--repeats", "2", "--out", str(tmp_path), "--json"])
    assert rc == 0
    info = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    files = table_files(tmp_path, "latency")
    assert len(files) == 1 and info["rows"] == 2 * 2 + 3 * 2 + 2
    t = read_table(files[0], "latency").to_pylist()
    ops = {r["op"] for r in t}
    assert ops == {"draft_step", "verify", "policy", "overhead"}
    for r in t:
        assert r["p10"] <= r["median"] <= r["p90"] and r["n"] >= 1 and r["device"].startswith("cpu")
    assert {(r["verify_size"], r["context_len"]) for r in t if r["op"] == "verify"} == \
        {(v, c) for v in (1, 8, 32) for c in (16, 64)}


def test_profile_bad_args(capsys):
    assert cli(["profile", "--head", "/no/such/head"]) == 2
    assert "EAGLE-3 head directory not found" in capsys.readouterr().err
    assert cli(["profile", "--verify-sizes", "1,x"]) == 2
