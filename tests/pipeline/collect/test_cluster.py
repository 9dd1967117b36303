"""`draftgym collect` on a Ray cluster: the pool sized from the cluster's resources, the runtime_env that
carries code and environment, a one-line error for an unreachable cluster, and a real 2-node local
cluster (two `ray start` nodes) whose shards all land under the driver's --out; `draftgym evaluate --ray`
on the same cluster equals one box."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from pipeline.collect.cluster import FORWARD_ENV, check_address, plan_actors, runtime_env
from pipeline.errors import DraftGymError

REPO = Path(__file__).resolve().parents[3]


def test_plan_actors_from_cluster_resources():
    gpu_nodes = [{"CPU": 16, "GPU": 4}, {"CPU": 16, "GPU": 4}, {"CPU": 8}]        # a CPU-only head node
    assert plan_actors(gpu_nodes) == {"actors": 8, "gpus": 1.0, "cpus": 1.0}
    assert plan_actors(gpu_nodes, num_gpus=2) == {"actors": 4, "gpus": 2.0, "cpus": 1.0}
    assert plan_actors(gpu_nodes, num_gpus=0.5, cpus_per_actor=2)["actors"] == 16
    assert plan_actors(gpu_nodes, num_actors=3) == {"actors": 3, "gpus": 1.0, "cpus": 1.0}
    with pytest.raises(DraftGymError, match="--num-gpus 8 per actor, but no node of the cluster has that many"):
        plan_actors(gpu_nodes, num_gpus=8)

    cpu_nodes = [{"CPU": 8}, {"CPU": 8}, {"CPU": 2}]
    assert plan_actors(cpu_nodes) == {"actors": 2, "gpus": 0.0, "cpus": 8.0}          # one per (largest) node
    assert plan_actors(cpu_nodes, cpus_per_actor=2) == {"actors": 9, "gpus": 0.0, "cpus": 2.0}
    assert plan_actors(cpu_nodes, num_actors=6) == {"actors": 6, "gpus": 0.0, "cpus": 3.0}
    assert plan_actors(cpu_nodes, cpus_per_actor=64)["cpus"] == 8.0                  # an actor fits on one node
    assert plan_actors([{"CPU": 2}]) == {"actors": 1, "gpus": 0.0, "cpus": 2.0}      # the embedded default
    with pytest.raises(DraftGymError, match="no node of the cluster has that many"):
        plan_actors(cpu_nodes, num_gpus=1)
    for kw, msg in [({"num_actors": 0}, "--num-actors must be >= 1"), ({"num_gpus": -1}, "--num-gpus must be >= 0"),
                    ({"cpus_per_actor": 0}, "--cpus-per-actor must be > 0")]:
        with pytest.raises(DraftGymError, match=msg):
            plan_actors(cpu_nodes, **kw)


def test_runtime_env_carries_code_and_environment(monkeypatch):
    for k in FORWARD_ENV:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    monkeypatch.setenv("DRAFTGYM_CACHE", "/shared/cache")
    env = runtime_env()
    assert env["env_vars"] == {"HF_TOKEN": "hf_test", "DRAFTGYM_CACHE": "/shared/cache"}
    assert env["working_dir"] == str(REPO)                         # this source checkout
    ex = set(env["excludes"])
    assert {"/tests", "/pyproject.toml"} <= ex and "/.venv" in ex | {"/.venv"}
    assert not {"/pipeline", "/simulator", "/online", "/data", "/data/heads"} & ex  # the code and the shipped head
    assert "/data/logs" in ex or not (REPO / "data" / "logs").exists()


def test_unreachable_cluster_is_one_line(tiny_model_dir, tmp_path):
    t0 = time.perf_counter()
    with pytest.raises(DraftGymError, match=r"cannot reach the Ray cluster at RAY_ADDRESS=127.0.0.1:1: "):
        check_address("127.0.0.1:1")
    with pytest.raises(DraftGymError, match="is not host:port"):
        check_address("nonsense")
    assert time.perf_counter() - t0 < 5
    # the whole command, in a fresh process (Ray not yet started there): exit 2, one line on stderr
    env = dict(os.environ, RAY_ADDRESS="127.0.0.1:1")
    p = subprocess.run([sys.executable, "-m", "online.cli", "collect", "--model", str(tiny_model_dir), "--head", "random",
                        "--n-prompts", "1", "--max-new-tokens", "4", "--out", str(tmp_path / "logs")],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr[-2000:]
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert lines == ["draftgym: error: cannot reach the Ray cluster at RAY_ADDRESS=127.0.0.1:1: Connection refused"]


# ----------------------------------------------------------------------------------------------
# a real 2-node cluster on this machine
# ----------------------------------------------------------------------------------------------

def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _ray_start(args: list[str], temp_dir: str, env: dict) -> None:
    """`ray start` one node; its own agent ports, so two nodes share the machine."""
    a, b, c, d = _free_ports(4)
    cmd = [str(Path(sys.executable).parent / "ray"), "start", *args, "--num-cpus=1", "--num-gpus=0",
           "--disable-usage-stats", f"--temp-dir={temp_dir}", f"--dashboard-agent-listen-port={a}",
           f"--metrics-export-port={b}", f"--dashboard-agent-grpc-port={c}", f"--runtime-env-agent-port={d}"]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=90)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")


def _stop_cluster(temp_dir: str) -> None:
    """Stop only this cluster's processes (those naming its temp dir, and their children), by pid:
    `ray stop` would kill every Ray on the machine."""
    def pids():
        own, parent = set(), {}
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                if temp_dir.encode() in (d / "cmdline").read_bytes():
                    own.add(int(d.name))
                parent[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
        grown = True
        while grown:
            kids = {p for p, pp in parent.items() if pp in own} - own
            grown = bool(kids)
            own |= kids
        return own

    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        for pid in pids():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.time() + wait
        while pids() and time.time() < deadline:
            time.sleep(0.2)


PROBE = """
import json, os
import ray
from pipeline.collect.cluster import init_ray, node_resources
init_ray()                                  # RAY_ADDRESS: the test cluster, with the job's runtime_env


def probe():                                # runs on a worker: what the runtime_env gave it
    import os
    import pipeline
    head = os.path.join(os.path.dirname(pipeline.__file__), "..", "data", "heads", "smollm2-135m", "config.json")
    return {"hf_token": os.environ.get("HF_TOKEN"), "pipeline": pipeline.__file__, "cwd": os.getcwd(),
            "default_head": os.path.isfile(head)}


nodes = sorted(k for n in node_resources() for k in n if k.startswith("node_"))
probes = ray.get([ray.remote(probe).options(num_cpus=0, resources={n: 0.01}).remote() for n in ("node_a", "node_b")])
print(json.dumps({"nodes": nodes, "probes": probes}))
"""


@pytest.mark.slow
def test_collect_on_a_two_node_cluster(tmp_path, tiny_model_dir, monkeypatch):
    from pipeline.logs.schema import read_table, table_files

    temp_dir = tempfile.mkdtemp(prefix="dgray", dir="/tmp")     # short: Ray's socket paths must fit 107 bytes
    # one auth mode on every node and the driver (Ray 2.5x+ turns token auth on for a head that finds
    # ~/.ray/auth_token, but a joining node only with RAY_AUTH_MODE=token); a loopback test cluster needs none
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "HF_TOKEN")}
    (port,) = _free_ports(1)
    try:
        _ray_start(["--head", f"--port={port}", "--include-dashboard=false", '--resources={"node_a": 1}'], temp_dir, env)
        _ray_start([f"--address=127.0.0.1:{port}", '--resources={"node_b": 1}'], temp_dir, env)
        monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
        monkeypatch.setenv("HF_TOKEN", "hf_only_via_runtime_env")     # the nodes were started without it
        (tmp_path / "driver").mkdir()
        # the command as a user runs it, from its own directory, in a fresh driver process (in a pytest process
        # that had run an embedded Ray before, Ray Data's actors on this cluster died at start: Ray 2.60)
        p = subprocess.run([sys.executable, "-m", "online.cli", "collect", "--model", str(tiny_model_dir), "--head",
                            "random", "--dataset", "humaneval", "--split", "all", "--n-prompts", "2", "--max-new-tokens", "6",
                            "--max-depth", "2", "--widths", "2", "--num-actors", "2", "--out", "relout", "--json"],
                           cwd=tmp_path / "driver", env=dict(os.environ), capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-3000:]
        s = json.loads(p.stdout.strip().splitlines()[-1])
        assert s["collected"] == 2 and s["actors"] == 2 and s["cpus_per_actor"] == 1.0 and s["gpus_per_actor"] == 0.0
        out = tmp_path / "driver" / "relout"
        assert s["out"] == str(out)
        seq = [read_table(f, "sequences") for f in table_files(out, "sequences")]
        assert sorted(t["prompt_id"][0].as_py() for t in seq) == ["humaneval/HumanEval/0", "humaneval/HumanEval/1"]
        assert len(table_files(out, "positions")) == 2 and (out / "_runs" / f"{seq[0]['run_key'][0]}.json").is_file()

        # evaluate as Ray tasks on the same cluster (chunks of 150 positions): equal to one box, in-process
        from simulator.evaluate import evaluate
        from simulator.logs.synthetic import SyntheticConfig, write_synthetic_logs

        logs = tmp_path / "synthetic"
        write_synthetic_logs(logs, SyntheticConfig(n_sequences=6, new_tokens=(20, 40), seed=4, shard_sequences=2))
        p = subprocess.run([sys.executable, "-m", "online.cli", "evaluate", "--logs", str(logs), "--ray", "--policy", "ddd",
                            "--max-positions-in-memory", "150", "--no-progress", "--json"],
                           cwd=tmp_path / "driver", env=dict(os.environ), capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-3000:]
        on_cluster, one_box = json.loads(p.stdout.strip().splitlines()[-1]), evaluate(logs, policies=["ddd"])
        assert on_cluster["streamed"] and on_cluster["results"] == one_box["results"]
        assert on_cluster["grid_best"] == one_box["grid_best"]

        # tune as Ray tasks (every position, chunks of 150): the chunks' closed batches pooled on the
        # cluster equal the same chunks replayed in this process
        from simulator.logs.stream import LogSource
        from simulator.serving.tune import TuneConfig, summary_rows, tune, tune_part
        from simulator.serving.inputs import load_inputs, profiled_candidates

        tl = tmp_path / "tune-logs"
        write_synthetic_logs(tl, SyntheticConfig(n_sequences=6, widths=(1, 4), new_tokens=(20, 40), seed=5,
                                                 shard_sequences=2, latency_profile="gpu", latency_batches=(1, 2, 4)))
        p = subprocess.run([sys.executable, "-m", "online.cli", "tune", "--logs", str(tl), "--split", "all", "--ray",
                            "--batch-sizes", "1,4", "--max-positions-in-memory", "150", "--out", str(tmp_path / "s.json"),
                            "--no-progress", "--json"],
                           cwd=tmp_path / "driver", env=dict(os.environ), capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-3000:]
        cfg = TuneConfig(logs=str(tl), out="", split="all", max_positions_in_memory=150)
        window, lat = load_inputs(cfg)
        shapes, _ = profiled_candidates(window, lat)
        src = LogSource(tl, split="all", widths="all", progress=False)
        measure = lambda bs: [tune_part(c, lat, bs, shapes) for c in src.chunks(150, scores=False)]
        assert len(measure([1])) > 1
        assert json.loads(p.stdout.strip().splitlines()[-1])["per_batch"] == \
            summary_rows(tune(window, lat, [1, 4], shapes, measure=measure))

        # what did the workers get? Asked from another fresh driver process: this pytest process never
        # connects to the test cluster (a later test's embedded Ray would not start cleanly after it)
        p = subprocess.run([sys.executable, "-c", PROBE], cwd=tmp_path / "driver", env=dict(os.environ),
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr[-3000:]
        res = json.loads(p.stdout.strip().splitlines()[-1])
        assert res["nodes"] == ["node_a", "node_b"]
        for pr in res["probes"]:
            assert pr["hf_token"] == "hf_only_via_runtime_env"
            assert not pr["pipeline"].startswith(str(REPO)) and pr["default_head"]     # shipped, not the checkout
            assert pr["cwd"] != str(tmp_path / "driver")
    finally:
        _stop_cluster(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)
