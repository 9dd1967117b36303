"""Small argument helpers shared by every `draftgym` subcommand (no heavy imports, no imports of
the subcommand modules, so pipeline/cli.py and the modules it registers import this one-way)."""
from __future__ import annotations

import argparse

DTYPES = ("float32", "bfloat16", "float16")


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """--help shows each option's default, unless its help already says it in words (or there is none
    worth printing: None, False)."""

    def _get_help_string(self, action):
        h = action.help or ""
        if (not action.option_strings or "(default" in h or "default:" in h.lower() or action.default in (None, False)
                or action.default is argparse.SUPPRESS):
            return h
        return h + " (default: %(default)s)"


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


def add_model_head(p: argparse.ArgumentParser, head_default: str = "default") -> None:
    """--model and --head, the same on every command that loads a target and a head."""
    p.add_argument("--model", default="smollm2-135m",
                   help="target: 'smollm2-135m' (embedded), a HF model directory or a hub id")
    p.add_argument("--head", default=head_default,
                   help="EAGLE-3 head: 'default' (the shipped one), 'random', a directory or a hub id")


def add_split(p: argparse.ArgumentParser) -> None:
    """--split with one vocabulary on every prompt-reading command (pipeline.datasets.resolve_split)."""
    p.add_argument("--split", default=None, choices=["train", "val", "test", "all"],
                   help="which prompts (default: test for a built-in dataset, every prompt of your own file)")


def add_no_progress(p: argparse.ArgumentParser) -> None:
    """--no-progress, the same on every long-running command: log files get result lines, not bars."""
    p.add_argument("--no-progress", action="store_true", help="no progress bars (for logs and CI)")


def add_device_dtype(p: argparse.ArgumentParser) -> None:
    """--device and --dtype, the same on every command that loads a target."""
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda if present, else cpu)")
    p.add_argument("--dtype", default=None, choices=DTYPES + ("fp32", "bf16", "fp16"),
                   help="the target's (and head's) compute dtype. Default: bfloat16 on a GPU; on a CPU "
                        "bfloat16 where it has bf16 units (AMX / AVX512-BF16), else float32 (override the CPU "
                        "default with DRAFTGYM_CPU_DTYPE=float32|bfloat16|auto). Logs, latency profiles and "
                        "reports record it, and never mix dtypes")
