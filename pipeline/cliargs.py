"""Small argument helpers shared by every `draftgym` subcommand (no heavy imports, no imports of
the subcommand modules, so the cli modules and the library modules import this one-way).

The settings pattern: each command is a documented `Config` dataclass and a `run_<command>_command(cfg)`
in its library module; the layer's cli module (pipeline/cli.py, simulator/cli.py, online/cli.py)
declares the flags (one option per field, dest = the field's name), builds the Config with
`config_from_args` and names the run function and the Config class with `set_command`.

Defaults are written once, in the Config: an option that sets a field has no argparse default (None),
`config_from_args` keeps the field's default for an option left at None, and --help reads the
default from the Config class (imported only when a command's help is shown). tests/test_cli.py checks
that no option of a Config field writes a default of its own."""
from __future__ import annotations

import argparse
import dataclasses
import importlib

DTYPES = ("float32", "bfloat16", "float16")


KEEP = object()      # a converted option left unset: config_from_args keeps the field's default


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """--help shows, for every option that takes a value, its default or "(required)": the Config field's
    default (`config`, 'module:Class', given to set_command) for an option that sets a field, else the
    option's own. A default of None says in the help what None means ("(default: the only one)"); a help
    that states its default in words gets nothing added. Flags (no value) and positionals get nothing."""

    def __init__(self, prog, config: str | None = None, **kw):
        super().__init__(prog, **kw)
        self._defaults = field_defaults(config) if config else {}

    def _get_help_string(self, action):
        h = action.help or ""
        if not action.option_strings or action.nargs == 0 or action.default is argparse.SUPPRESS:
            return h
        if action.required:
            return h if "(required)" in h else h + " (required)"
        default = action.default
        if default is None and action.dest in self._defaults:
            default = self._defaults[action.dest]
        if default is None or "(default" in h or "default:" in h.lower():
            return h
        if default == [] or default == ():
            return h + " (default: none)"
        if isinstance(default, (tuple, list)):      # comma lists; ';' between items that hold commas
            default = (";" if any("," in str(x) for x in default) else ",").join(map(str, default))
        return h + f" (default: {str(default).replace('%', '%%')})"


def at_least(minimum, kind=int, strict: bool = False):
    """An argparse `type`: a number of `kind` >= minimum (> minimum when strict), else argparse's error
    naming the option and the value ("argument --steps: must be >= 1, got 0"), before anything runs."""
    def parse(s: str):
        try:
            v = kind(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, got {s!r}") from None
        if v < minimum or (strict and v == minimum):
            raise argparse.ArgumentTypeError(f"must be {'>' if strict else '>='} {minimum}, got {s}")
        return v

    parse.__name__ = kind.__name__
    return parse


COUNT = at_least(1)                          # sizes, counts, steps: >= 1
NON_NEGATIVE = at_least(0)                   # seeds, optional extras where 0 means none: >= 0
POSITIVE_FLOAT = at_least(0.0, float, strict=True)    # rates, times, learning rates: > 0
NON_NEGATIVE_FLOAT = at_least(0.0, float)    # temperatures, GPU counts: >= 0


class OneLineParser(argparse.ArgumentParser):
    """A subcommand's parser whose errors are one line ("draftgym train: error: argument --steps: must
    be >= 1, got 0"), as every other DraftGym error; --help shows the usage."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def field_defaults(config: str) -> dict:
    """{field: default} of the Config class 'module:Class' ('module:A,B': of each, the first one's
    default first), nested Config fields included (a field whose default is a dataclass contributes
    that dataclass's fields, outer names first)."""
    module, name = config.split(":")
    out: dict = {}

    def walk(cls):
        nested = []
        for f in dataclasses.fields(cls):
            if f.default is not dataclasses.MISSING:
                d = f.default
            elif f.default_factory is not dataclasses.MISSING:
                d = f.default_factory()
            else:
                continue
            out.setdefault(f.name, d)
            if dataclasses.is_dataclass(d):
                nested.append(type(d))
        for c in nested:
            walk(c)

    for cls in name.split(","):
        walk(getattr(importlib.import_module(module), cls))
    return out


def given(value, convert):
    """convert(value) for an option the user gave; KEEP (the field's default) for one left at None."""
    return KEEP if value is None else convert(value)


def config_from_args(cls, args: argparse.Namespace, **converted):
    """The `cls` Config dataclass of a command from its parsed options: each field takes the option of
    the same name (its dest); an option left at None keeps the field's default; `converted` gives the
    fields whose option needs converting (comma lists, renamed flags), taken as they are unless KEEP
    (`given`: the option was left unset)."""
    parsed = vars(args)
    fields = {f.name: parsed[f.name] for f in dataclasses.fields(cls) if parsed.get(f.name) is not None}
    return cls(**{**fields, **{k: v for k, v in converted.items() if v is not KEEP}})


def set_command(p: argparse.ArgumentParser, make_config, run: str, config: str) -> None:
    """What p's command does: `run(make_config(args))`. make_config builds the command's Config from the
    parsed options (importing its class when called); run is 'module:function' and config 'module:Class',
    imported only when the command runs or shows its --help, so building the parser (`draftgym --help`)
    imports no torch. online.cli.main calls them."""
    p.set_defaults(make_config=make_config, run=run, config=config)


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


def add_model_head(p: argparse.ArgumentParser, head_default: str = "") -> None:
    """--model and --head, the same on every command that loads a target and a head; head_default: what a command
    whose Config leaves --head at None does instead (said in words in --help)."""
    p.add_argument("--model", help="target: 'smollm2-135m' (embedded), a HF model directory or a hub id")
    p.add_argument("--head", help="EAGLE-3 head: 'default' (the shipped one), 'random', a directory or a hub id"
                                  + (f" (default: {head_default})" if head_default else ""))


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


def window_arg(p: argparse.ArgumentParser) -> None:
    """--max-positions-in-memory: the one memory knob of every command that reads positions."""
    p.add_argument("--max-positions-in-memory", type=COUNT, default=None,
                   help="logs with more positions are read a chunk (evaluate, tune --ray; validate's grid-best) or a "
                        "seeded sampled window (train, tune, serve-eval, train-load, transfer; validate: plus the decoded "
                        "prompts' sequences) of this many at a time: about 3-6 KB each at W = 10")
