"""Reproducible installs: constraints.txt pins every declared dependency to one exact version that
satisfies pyproject.toml's range, `make setup` installs against it, and this venv holds those versions."""
from __future__ import annotations

import re
import tomllib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]


def declared() -> list[Requirement]:
    """pyproject's dependencies and dev extras."""
    proj = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [Requirement(r) for r in proj["dependencies"] + proj["optional-dependencies"]["dev"]]


def pins() -> dict[str, Version]:
    """constraints.txt as {canonical name: pinned version}; every line is a comment or name==version."""
    out = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", line.strip())
            assert m, f"constraints.txt: not an exact pin: {line!r}"
            out[canonicalize_name(m[1])] = Version(m[2])
    return out


def makefile_var(name: str) -> str:
    """The value of `NAME ?= value` / `NAME := value` in the Makefile (continuation lines joined)."""
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    m = re.search(rf"^{name}\s*[?:]?=\s*(.*)$", text, re.M)
    assert m, f"Makefile sets no {name}"
    return " ".join(m[1].split())


def test_every_declared_dependency_is_pinned_inside_its_range():
    p = pins()
    torch_spec = Requirement(makefile_var("TORCH_SPEC"))
    for req in declared():
        name = canonicalize_name(req.name)
        if name == "torch":   # pinned by the Makefile's TORCH_SPEC (a GPU box overrides it), not here
            assert name not in p and str(torch_spec.specifier).startswith("=="), torch_spec
            assert req.specifier.contains(str(torch_spec.specifier)[2:]), (req, torch_spec)
            continue
        assert name in p, f"constraints.txt does not pin {req.name} (pyproject: {req})"
        assert req.specifier.contains(p[name], prereleases=True), f"{req.name}=={p[name]} is outside {req}"


def test_transformers_is_capped_and_the_pin_satisfies_the_cap():
    (tf,) = [r for r in declared() if canonicalize_name(r.name) == "transformers"]
    uppers = [s for s in tf.specifier if s.operator == "<"]
    assert uppers, f"pyproject does not cap transformers: {tf}"
    # the pipeline passes `cache=` to the target forward, which transformers 5.24 introduced
    assert not tf.specifier.contains("5.23.0") and tf.specifier.contains("5.24.0"), tf
    assert all(Version(s.version) > pins()["transformers"] for s in uppers)
    assert tf.specifier.contains(pins()["transformers"])


def test_nodeps_packages_and_torch_are_pinned_once():
    """The Makefile pins torch and the --no-deps data packages itself; constraints.txt leaves them out."""
    nodeps = [Requirement(r) for r in makefile_var("NODEPS_PKGS").split()]
    assert all(str(r.specifier).startswith("==") for r in nodeps)
    assert not {canonicalize_name(r.name) for r in nodeps} & set(pins())


def test_make_setup_installs_against_the_constraints():
    text = (ROOT / "Makefile").read_text()
    setup = text.split("$(STAMP):", 1)[1].split("\n\n", 1)[0]          # the setup recipe
    assert "$(CONSTRAINTS)" in setup.splitlines()[0]                     # a new pin re-runs setup
    installs = [ln for ln in setup.splitlines() if "pip install" in ln]
    assert len(installs) >= 4 and all("-c $(CONSTRAINTS)" in ln for ln in installs), installs
    assert makefile_var("CONSTRAINTS") == "constraints.txt"


def test_this_venv_holds_the_pinned_versions():
    """`make setup` (re-run whenever constraints.txt changes) installs exactly these versions."""
    wrong = []
    for name, v in pins().items():
        try:
            got = Version(version(name))
        except PackageNotFoundError:
            continue           # pinned for a platform or extra this venv does not use
        if got != v:
            wrong.append(f"{name}: installed {got}, pinned {v}")
    if wrong:
        pytest.fail("venv out of date with constraints.txt (run `make setup`): " + "; ".join(wrong))
