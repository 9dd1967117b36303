"""Small argument helpers shared by every `draftgym` subcommand (no heavy imports, no imports of
the subcommand modules, so pipeline/cli.py and the modules it registers import this one-way)."""
from __future__ import annotations

import argparse

DTYPES = ("float32", "bfloat16", "float16")


def parse_positive_ints(s: str, name: str) -> tuple[int, ...]:
    """'10,8,12' -> (10, 8, 12), with a one-line error for anything else."""
    from pipeline.errors import DraftGymError

    try:
        v = tuple(int(x) for x in s.split(","))
    except ValueError:
        raise DraftGymError(f"{name} must be comma-separated integers, got {s!r}") from None
    if any(x < 1 for x in v):
        raise DraftGymError(f"{name} values must be >= 1")
    return v


def add_device_dtype(p: argparse.ArgumentParser) -> None:
    """--device and --dtype, the same on every command that loads a target."""
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda if present, else cpu)")
    p.add_argument("--dtype", default=None, choices=DTYPES + ("fp32", "bf16", "fp16"),
                   help="the target's (and head's) compute dtype. Default: bfloat16 on a GPU; on a CPU "
                        "`pipeline.target.default_cpu_dtype()` (float32 unless DRAFTGYM_CPU_DTYPE says otherwise). "
                        "Logs, latency profiles and reports record it, and never mix dtypes")
