"""Small argument helpers shared by every `draftgym` subcommand (no heavy imports, no imports of
the subcommand modules, so the cli modules and the library modules import this one-way).

The settings pattern: each command is a documented `Config` dataclass and a `run_<command>_command(cfg)`
in its library module; the layer's cli module (pipeline/cli.py, simulator/cli.py, online/cli.py)
declares the flags (one option per field, dest = the field's name), builds the Config with
`config_from_args` and names the run function with `set_command`."""
from __future__ import annotations

import argparse
import dataclasses

DTYPES = ("float32", "bfloat16", "float16")


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """--help shows, for every option that takes a value, its default or "(required)". An option whose
    default is None says in its help what None means ("(default: the only one)"); one whose help already
    states its default in words gets nothing added. Flags (no value) and positionals get nothing."""

    def _get_help_string(self, action):
        h = action.help or ""
        if not action.option_strings or action.nargs == 0 or action.default is argparse.SUPPRESS:
            return h
        if action.required:
            return h if "(required)" in h else h + " (required)"
        if action.default is None or "(default" in h or "default:" in h.lower():
            return h
        if action.default == []:
            return h + " (default: none)"
        return h + " (default: %(default)s)"


def config_from_args(cls, args: argparse.Namespace, **converted):
    """The `cls` Config dataclass of a command from its parsed options: each field takes the option of
    the same name (its dest); an option left at None keeps the field's default (train-draft's flags,
    whose defaults live in TrainConfig); `converted` gives the fields whose option needs converting
    (comma lists, renamed flags), taken as they are."""
    parsed = vars(args)
    fields = {f.name: parsed[f.name] for f in dataclasses.fields(cls) if parsed.get(f.name) is not None}
    return cls(**{**fields, **converted})


def set_command(p: argparse.ArgumentParser, make_config, run: str) -> None:
    """What p's command does: `run(make_config(args))`. make_config builds the command's Config from the
    parsed options (importing its class when called); run is 'module:function', imported only when the
    command runs, so building the parser (`draftgym --help`) imports no torch. online.cli.main calls them."""
    p.set_defaults(make_config=make_config, run=run)


def comma_list(s: str | None) -> tuple[str, ...]:
    """'a, b,,c' -> ('a', 'b', 'c'); None or '' -> ()."""
    return tuple(x.strip() for x in (s or "").split(",") if x.strip())


def parse_positive_ints(s: str, name: str, minimum: int = 1) -> tuple[int, ...]:
    """'10,8,12' -> (10, 8, 12), with a one-line error for anything else (or a value below `minimum`)."""
    from pipeline.errors import DraftGymError

    try:
        v = tuple(int(x) for x in s.split(","))
    except ValueError:
        raise DraftGymError(f"{name} must be comma-separated integers, got {s!r}") from None
    if any(x < minimum for x in v):
        raise DraftGymError(f"{name} values must be >= {minimum}")
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
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars (for logs and CI)")


def add_json(p: argparse.ArgumentParser, help: str = "print one JSON object") -> None:
    """--json, the same on every command that can print its result as one JSON object."""
    p.add_argument("--json", dest="as_json", action="store_true", help=help)


def add_device_dtype(p: argparse.ArgumentParser) -> None:
    """--device and --dtype, the same on every command that loads a target."""
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda if present, else cpu)")
    p.add_argument("--dtype", default=None, choices=DTYPES + ("fp32", "bf16", "fp16"),
                   help="the target's (and head's) compute dtype. Default: bfloat16 on a GPU; on a CPU "
                        "bfloat16 where it has bf16 units (AMX / AVX512-BF16), else float32 (override the CPU "
                        "default with DRAFTGYM_CPU_DTYPE=float32|bfloat16|auto). Logs, latency profiles and "
                        "reports record it, and never mix dtypes")
