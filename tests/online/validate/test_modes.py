"""validate's three modes (online/validate/common.py): the settings a user gives pick the mode's config,
and a setting of another mode is refused in one line before anything loads."""
from __future__ import annotations

import dataclasses
import re

import pytest

from online.cli import main as cli
from online.validate.common import (Batch1Config, BatchSizesConfig, LoadTraceConfig, ValidateConfig,
                                    validate_mode)
from pipeline.errors import DraftGymError


def test_each_mode_holds_the_shared_settings_and_its_own():
    shared = {f.name for f in dataclasses.fields(ValidateConfig)}
    own = {m: {f.name for f in dataclasses.fields(m)} - shared for m in (Batch1Config, BatchSizesConfig, LoadTraceConfig)}
    assert own == {Batch1Config: {"reanchor"}, BatchSizesConfig: {"shapes", "schedule", "batch_sizes"},
                   LoadTraceConfig: {"shapes", "schedule", "load_trace", "max_batch", "row_budget_k", "nightjar_k",
                                     "acceptance_model"}}


@pytest.mark.parametrize("given, mode", [({}, Batch1Config), ({"reanchor": "--no-reanchor"}, Batch1Config),
                                         ({"batch_sizes": "--batch-sizes", "shapes": "--shapes"}, BatchSizesConfig),
                                         ({"load_trace": "--load-trace", "nightjar_k": "--nightjar-k",
                                           "schedule": "--schedule"}, LoadTraceConfig)])
def test_the_settings_given_pick_the_mode(given, mode):
    assert validate_mode(given) is mode


@pytest.mark.parametrize("given, msg", [
    ({"max_batch": "--max-batch"}, "--max-batch is a setting of --load-trace, not of batch 1"),
    ({"shapes": "--shapes"}, "--shapes is a setting of --batch-sizes and of --load-trace, not of batch 1"),
    ({"batch_sizes": "--batch-sizes", "reanchor": "--no-reanchor"},
     "--no-reanchor is a setting of batch 1 (no --batch-sizes or --load-trace), not of --batch-sizes"),
    ({"batch_sizes": "--batch-sizes", "nightjar_k": "--nightjar-k"}, "--nightjar-k is a setting of --load-trace, not of --batch-sizes"),
    ({"batch_sizes": "--batch-sizes", "load_trace": "--load-trace"}, "two runs"),
    ({"schedule": "--schedule"}, "--schedule needs --batch-sizes or --load-trace")])
def test_a_setting_of_another_mode_is_one_line(given, msg):
    with pytest.raises(DraftGymError, match=re.escape(msg)):
        validate_mode(given)


def test_the_command_refuses_it_before_loading_anything(tmp_path, capsys):
    assert cli(["validate", "--model", str(tmp_path / "absent"), "--max-batch", "4", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("draftgym: error: --max-batch is a setting of --load-trace, not of batch 1 "
                   "(no --batch-sizes or --load-trace)"), err
    assert not any(tmp_path.iterdir())                  # nothing written


def test_help_shows_every_modes_defaults(capsys):
    assert cli(["validate", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "the most rows decoding at once (default: 16)" in out and "static shapes, each chain:K or tree:D,W,V" in out
