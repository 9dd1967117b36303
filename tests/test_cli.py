"""The `draftgym` command line as one thing: every subcommand's --help shows a default (or "required")
for each option that takes a value, the defaults are written once (in the Config dataclasses; no option
of a field writes its own), every number has a range checked before anything runs, and building the
parser imports nothing heavy."""
from __future__ import annotations

import argparse
import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest

from online.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]

def _subparsers() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_every_option_that_takes_a_value_shows_its_default_or_required():
    """--help of every subcommand: each option with a value says its default ('(default: 10)', or what
    None means in words) or '(required)'; flags (no value) need neither."""
    missing = []
    for name in _subparsers():
        for opt, text in _option_help(name).items():
            if not re.search(r"\(default|default:|\(required\)", text, re.I):
                missing.append(f"{name} {opt}: {text!r}")
    assert not missing, "\n".join(missing)
    collect = _option_help("collect")
    assert collect["--temperature"].endswith("(default: 0.0)") and collect["--seed"].endswith("(default: 0)")
    assert collect["--model"].endswith("(default: smollm2-135m)")          # 0 and 0.0 are defaults too
    assert _option_help("evaluate")["--logs"].endswith("(required)")


def _option_help(name: str) -> dict[str, str]:
    """{option: its --help text as printed, unwrapped} of the options of `name` that take a value."""
    sp = _subparsers()[name]
    fmt = sp.formatter_class(sp.prog)
    return {a.option_strings[0]: fmt._get_help_string(a) % {**vars(a), "prog": sp.prog} for a in sp._actions
            if a.option_strings and a.nargs != 0 and a.help != argparse.SUPPRESS}


def _fields(cfg) -> dict:
    """A config as {field: value}, nested configs flattened as 'outer.inner'."""
    out = {}
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        if dataclasses.is_dataclass(v):
            out.update({f"{f.name}.{k}": x for k, x in _fields(v).items()})
        else:
            out[f.name] = v
    return out


def _required_argv(sp: argparse.ArgumentParser) -> list[str]:
    """Some value for each required option (its first choice, else '1') and positional."""
    argv = []
    for a in sp._actions:
        value = str(a.choices[0]) if a.choices else "1"
        if a.required and a.option_strings:
            argv += [a.option_strings[0], value]
        elif not a.option_strings and a.nargs is None:
            argv.append(value)
    return argv


@pytest.mark.parametrize("name", sorted(_subparsers()))
def test_flag_defaults_are_the_config_defaults(name):
    """A command run with only its required options gets its Config dataclass's defaults: the flags
    and the Config say the same (except the fields the required options set, and collect's dtype and
    split, which the command resolves for the machine and the dataset)."""
    argv = _required_argv(_subparsers()[name])
    args = build_parser().parse_args([name, *argv])
    cfg = args.make_config(args)
    given = {a.dest for a in _subparsers()[name]._actions if set(a.option_strings) & set(argv) or not a.option_strings}
    resolved = {"data.dtype", "data.split"} if name == "collect" else set()
    got, want = _fields(cfg), _fields(type(cfg)())
    diff = {k: (got[k], want[k]) for k in want
            if got[k] != want[k] and k.split(".")[-1] not in given and k not in resolved}
    assert not diff, diff
    module, fn = args.run.split(":")
    assert callable(getattr(__import__(module, fromlist=[fn]), fn))


def test_no_option_writes_a_default_of_its_own():
    """Defaults are written once: an option that sets a Config field leaves its argparse default at None
    (config_from_args then keeps the field's), so --help and the command read the one in the Config."""
    from pipeline.cliargs import field_defaults

    own = []
    for name, sp in _subparsers().items():
        fields = field_defaults(sp.get_default("config"))
        own += [f"{name} {a.option_strings[0]}={a.default!r}" for a in sp._actions
                if a.option_strings and a.nargs != 0 and a.dest in fields and a.default not in (None, [])
                and not isinstance(a, argparse._AppendAction)]
    assert not own, own
    validate = _option_help("validate")
    assert validate["--shapes"].endswith("(default: tree:8,10,60;chain:2;chain:4)")   # the Config's tuple, as typed
    assert validate["--n-prompts"].endswith("(default: 5)")


def test_every_number_has_a_range():
    """No option takes a bare int or float: each names its range (pipeline.cliargs.at_least)."""
    bare = [f"{name} {a.option_strings[0]}" for name, sp in _subparsers().items() for a in sp._actions
            if a.type in (int, float)]
    assert not bare, bare


@pytest.mark.parametrize("argv, says", [
    (["train", "--logs", "x", "--method", "ltd", "--out", "y", "--steps", "0"], "argument --steps: must be >= 1, got 0"),
    (["validate", "--runs", "-5"], "argument --runs: must be >= 1, got -5"),
    (["validate", "--temperature", "-1"], "argument --temperature: must be >= 0.0, got -1"),
    (["serve-eval", "--logs", "x", "--tpot-target", "0"], "argument --tpot-target: must be > 0.0, got 0"),
    (["collect", "--n-prompts", "ten"], "argument --n-prompts: expected an integer, got 'ten'"),
])
def test_out_of_range_numbers_are_refused_in_one_line(argv, says, capsys):
    from online.cli import main

    assert main(argv) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"draftgym {argv[0]}: error: {says}"]


def test_building_the_parser_imports_nothing_heavy():
    """`draftgym --help` builds every subparser without importing torch or numpy: the commands' modules
    load only when one runs."""
    code = ("import sys; from online.cli import build_parser; build_parser(); "
            "heavy = [m for m in ('torch', 'numpy', 'transformers', 'ray') if m in sys.modules]; "
            "assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_the_replay_imports_no_torch():
    """The reason the simulator's and the pipeline's torch imports are lazy (docs/design.md, "Data flow"):
    the replay, evaluate, serve-eval, tune, the latency model and the logs import no torch, transformers,
    Ray or matplotlib, so a CPU-only replay starts in a fraction of a second."""
    mods = ["simulator.replay", "simulator.evaluate", "simulator.serve_eval", "simulator.serving.tune",
            "simulator.latency.model", "simulator.logs.replay_logs", "simulator.baselines", "simulator.envs.core",
            "simulator.serving.load", "pipeline.logs.schema", "pipeline.decode.step_shape"]
    code = (f"import importlib, sys; [importlib.import_module(m) for m in {mods!r}]; "
            "heavy = [m for m in ('torch', 'transformers', 'ray', 'matplotlib') if m in sys.modules]; "
            "assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)
