"""``kvspec --help`` starts light: building the parser imports neither Z3 nor
Hypothesis (nor matplotlib); they load when a command that needs them runs."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("z3", "hypothesis", "matplotlib", "crosshair")


def _imported(args: list[str]) -> set[str]:
    """The top-level names of the modules ``python -m kvspec ARGS`` imports
    (``-X importtime`` lists every module imported, one a line, on stderr)."""
    run = subprocess.run([sys.executable, "-X", "importtime", "-m", "kvspec", *args],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "usage: kvspec" in run.stdout
    names = set()
    for line in run.stderr.splitlines():
        if line.startswith("import time:") and line.count("|") == 2:
            names.add(line.rsplit("|", 1)[1].strip().split(".")[0])
    assert "kvspec" in names  # the listing is what it claims to be
    return names


@pytest.mark.parametrize("args", [["--help"], ["prove", "--help"], ["fuzz", "--help"]])
def test_help_imports_nothing_heavy(args):
    assert not _imported(args) & set(HEAVY)


def test_the_lazy_model_names_still_import():
    code = ("import sys\n"
            "import kvspec.model as m\n"
            "assert 'z3' not in sys.modules\n"
            "from kvspec.model import INT, Z3Arith, VARIANTS, registration_bound, CoordinatorConfig\n"
            "assert 'z3' in sys.modules and m.Z3Arith is Z3Arith and set(m.__all__) <= set(dir(m))\n"
            "from kvspec.model import *\n"
            "print(len(VARIANTS))\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    with pytest.raises(AttributeError):
        import kvspec.model

        kvspec.model.no_such_name  # noqa: B018
