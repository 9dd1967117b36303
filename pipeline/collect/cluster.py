"""Ray for `draftgym collect`: connect (embedded or RAY_ADDRESS), ship the code, size the actor pool.

- `init_ray`: with RAY_ADDRESS set it first checks the address takes a TCP connection (a wrong
  address is a one-line DraftGymError within seconds; Ray itself would retry for a minute, then
  abort the process), connects, and passes `runtime_env()`; without it, Ray starts embedded and local
  and needs no runtime_env (its workers see this machine's files and environment).
- `runtime_env`: the code (the source checkout as working_dir: pipeline/, simulator/, online/ and
  data/heads/ for the shipped head; or, for an installed package, the three packages as
  py_modules) and the environment variables a worker needs (FORWARD_ENV, those that are set).
- `plan_actors`: GPUs per actor and the actor count from the cluster's own resources (`ray.nodes()`),
  not from the driver's hardware.
"""
from __future__ import annotations

import importlib
import math
import os
import socket
from pathlib import Path

from pipeline.errors import DraftGymError, first_line

# environment variables carried to the workers of an existing cluster (only those set on the driver):
# the cache root, the hub token, and object-store credentials for an s3:// --out
FORWARD_ENV = ("DRAFTGYM_CACHE", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_ENDPOINT", "AWS_ACCESS_KEY_ID",
               "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL")
PACKAGES = ("pipeline", "simulator", "online")
CONNECT_TIMEOUT_S = 5.0


def check_address(addr: str, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """A one-line DraftGymError unless host:port of a Ray address ('host:port', 'ray://host:port')
    accepts a TCP connection. 'auto' and 'local' are left to Ray."""
    if addr in ("auto", "local"):
        return
    hostport = addr.split("://", 1)[-1].rstrip("/")
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise DraftGymError(f"RAY_ADDRESS={addr} is not host:port (or ray://host:port, or auto)")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as e:
        raise DraftGymError(f"cannot reach the Ray cluster at RAY_ADDRESS={addr}: "
                            f"{e.strerror or type(e).__name__}") from None


def runtime_env() -> dict:
    """The runtime_env of a job on an existing cluster (see the module doc)."""
    import pipeline

    root = Path(pipeline.__file__).resolve().parent.parent
    env = {"env_vars": {k: os.environ[k] for k in FORWARD_ENV if os.environ.get(k)}}
    if (root / "pyproject.toml").is_file() and all((root / p).is_dir() for p in PACKAGES):
        keep = set(PACKAGES) | {"data"}
        excludes = [f"/{p.name}" for p in root.iterdir() if p.name not in keep]
        if (root / "data").is_dir():
            excludes += [f"/data/{p.name}" for p in (root / "data").iterdir() if p.name != "heads"]
        env.update(working_dir=str(root), excludes=excludes + ["__pycache__", "*.pyc"])
    else:
        env["py_modules"] = [str(Path(importlib.import_module(p).__file__).parent) for p in PACKAGES]
    return env


def init_ray(num_cpus: int | None = None):
    import ray

    if ray.is_initialized():
        return ray
    addr = os.environ.get("RAY_ADDRESS")
    kw = dict(include_dashboard=False, log_to_driver=True, configure_logging=False)
    if addr:
        check_address(addr)
        try:
            ray.init(address=addr, runtime_env=runtime_env(), **kw)
        except Exception as e:      # an auth refusal, a version mismatch: one line, no traceback
            raise DraftGymError(f"cannot connect to the Ray cluster at RAY_ADDRESS={addr}: {first_line(e)}") from None
    else:
        ray.init(num_cpus=num_cpus or os.cpu_count(), **kw)
    from ray.data import DataContext
    DataContext.get_current().enable_progress_bars = False      # the caller shows its own progress
    return ray


def node_resources() -> list[dict]:
    """The resources (CPU, GPU, ...) of each alive node of the connected cluster."""
    import ray

    return [n["Resources"] for n in ray.nodes() if n.get("Alive")]


def check_actor_options(num_actors: int | None, num_gpus: float | None, cpus_per_actor: float | None) -> None:
    """One-line errors for impossible pool options (before any model or cluster is touched)."""
    if num_actors is not None and num_actors < 1:
        raise DraftGymError(f"--num-actors must be >= 1, got {num_actors}")
    if num_gpus is not None and num_gpus < 0:
        raise DraftGymError(f"--num-gpus must be >= 0, got {num_gpus:g}")
    if cpus_per_actor is not None and cpus_per_actor <= 0:
        raise DraftGymError(f"--cpus-per-actor must be > 0, got {cpus_per_actor:g}")


def plan_actors(nodes: list[dict], num_actors: int | None = None, num_gpus: float | None = None,
                cpus_per_actor: float | None = None) -> dict:
    """{'actors', 'gpus', 'cpus'}: the pool size and the resources each actor asks for.

    GPUs per actor: `num_gpus`, else 1 when the cluster has a GPU, else 0. Actors: `num_actors`, else
    on a GPU cluster one per `gpus` GPUs, on a CPU cluster one per `cpus_per_actor` CPUs, counted
    node by node (at least 1). CPUs per actor: `cpus_per_actor`, else 1 with GPUs; on a CPU cluster
    the largest node's CPUs (one actor per node, all its cores) or, with `num_actors`, the cluster's
    CPUs shared among them; never more than the largest node has (an actor must fit on one node)."""
    check_actor_options(num_actors, num_gpus, cpus_per_actor)
    cpus = [float(n.get("CPU", 0)) for n in nodes] or [float(os.cpu_count() or 1)]
    gpus = [float(n.get("GPU", 0)) for n in nodes] or [0.0]
    if num_gpus is None:
        num_gpus = 1.0 if sum(gpus) > 0 else 0.0
    if num_gpus > max(gpus):
        raise DraftGymError(f"--num-gpus {num_gpus:g} per actor, but no node of the cluster has that many "
                            f"(GPUs per node: {', '.join(f'{g:g}' for g in gpus)})")
    if num_gpus > 0:
        cpu = cpus_per_actor or 1.0
        per_node = [math.floor(g / num_gpus + 1e-9) for g in gpus]
    else:
        cpu = cpus_per_actor or (sum(cpus) / num_actors if num_actors else max(cpus))
        per_node = [math.floor(c / min(cpu, max(cpus)) + 1e-9) for c in cpus]
    cpu = min(cpu, max(cpus))
    return {"actors": num_actors or max(1, sum(per_node)), "gpus": float(num_gpus), "cpus": float(cpu)}
