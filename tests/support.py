"""What kvspec's own tests share: capabilities of a known release, snapshot
files, a strategy for single-group inputs, and trees planted with code."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from hypothesis import strategies as st

from kvspec.model.capabilities import Capabilities, known_capabilities
from kvspec.model.spec import BoundaryInputs

__all__ = ["asked_vllm_tests", "VLLM_CATCHER", "capabilities", "assert_snapshot", "boundary_inputs", "z3_value", "planted_tree", "mutant_tree",
           "check_command", "SNAPSHOTS", "FIXTURES"]

SNAPSHOTS = Path(__file__).with_name("snapshots")
FIXTURES = Path(__file__).with_name("fixtures")


def capabilities(version: str = "0.33.0") -> Capabilities:
    """What release ``version``'s code can do (kvspec's table of eras)."""
    found = known_capabilities(version)
    assert found is not None, f"no known era for {version}"
    return found


def assert_snapshot(name: str, text: str) -> None:
    """Compare with ``tests/snapshots/NAME``, or rewrite it with KVSPEC_UPDATE_SNAPSHOTS=1."""
    path = SNAPSHOTS / name
    if os.environ.get("KVSPEC_UPDATE_SNAPSHOTS"):
        path.write_text(text)
    assert path.exists(), f"no snapshot {name}: run with KVSPEC_UPDATE_SNAPSHOTS=1 and review it"
    assert text == path.read_text(), f"{name} changed: review, then KVSPEC_UPDATE_SNAPSHOTS=1"


@st.composite
def boundary_inputs(draw, max_block: int = 6, max_tokens: int = 200) -> BoundaryInputs:
    """Well-formed single-group inputs of the registration rule."""
    H = draw(st.integers(1, max_block))
    B = H * draw(st.integers(1, max_block))
    S = B * draw(st.integers(1, max_block))
    eagle = draw(st.booleans())
    partial = draw(st.booleans()) and H < S
    L = draw(st.integers(0, S if eagle else 3 * S))
    n = draw(st.integers(0, max_tokens))
    return BoundaryInputs(n=n, S=S, H=H, B=B, L=L, eagle=eagle, partial=partial)


def z3_value(rule, p: BoundaryInputs) -> int:
    """``rule`` at the concrete point ``p``, computed by Z3 (the proofs' backend)."""
    import z3

    from kvspec.model.arith import Z3Arith

    ar = Z3Arith()
    ctx = ar.ctx
    symbolic = BoundaryInputs(
        n=z3.IntVal(p.n, ctx), S=z3.IntVal(p.S, ctx), H=z3.IntVal(p.H, ctx),
        B=z3.IntVal(p.B, ctx), L=z3.IntVal(p.L, ctx),
        eagle=z3.BoolVal(p.eagle, ctx), partial=z3.BoolVal(p.partial, ctx),
    )
    term = z3.simplify(rule(ar, symbolic))
    assert z3.is_int_value(term), f"did not reduce to a numeral: {term}"
    return term.as_long()


RULE_LINE = "        cached_num_computed_tokens = self._align_cacheable(num_computed_tokens)\n"


def planted_tree(tmp_path: Path, statement: str, before: str = RULE_LINE, name: str = "planted") -> Path:
    """A copy of 0.33.0 whose coordinator runs ``statement`` just before the
    line ``before`` (by default: the first line of the registration rule)."""
    from kvspec.subjects.provision import ensure_release

    tree = tmp_path / name
    shutil.copytree(ensure_release("0.33.0"), tree)
    target = tree / "vllm" / "v1" / "core" / "kv_cache_coordinator.py"
    text = target.read_text()
    assert text.count(before) == 1, "the 0.33.0 line moved: update this helper"
    indent = before[: len(before) - len(before.lstrip())]
    target.write_text(text.replace(before, f"{indent}{statement}\n" + before))
    return tree


def mutant_tree(version: str, operator: str) -> Path:
    """The (cached, checked) tree of release ``version`` with ``operator`` applied."""
    from kvspec.subjects.mutation import ensure_mutant_tree, mutant

    return ensure_mutant_tree(version, mutant(operator))


def check_command(recipe: str) -> str:
    """The ``kvspec check`` command line a CI recipe runs."""
    import re

    from kvspec.commands.recipe import recipe_text

    (command,) = re.findall(r"kvspec check --[^|\n]*", recipe_text(recipe))
    return command.strip()


def interruptible() -> None:
    """``preexec_fn`` for a child a test sends Ctrl-C: SIGINT back to its
    default action.  A suite started in the background by a non-interactive
    shell (as CI scripts may be) inherits SIGINT ignored, and Python then
    never raises KeyboardInterrupt: the child would run on as if never interrupted."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


# vLLM 0.33.0's own test that catches #50062 (kvspec.findings.vllm_suite).
VLLM_CATCHER = ("tests/v1/core/prefix_cache/test_partial_prefix_cache_hits.py::"
                "test_eagle_group_registers_unaligned_tail_under_partial_hash_hits")


def asked_vllm_tests(caught: list[str], failed_here: list[str] | None = None, reused: bool = True) -> dict:
    """A finding's record of vLLM's 313 tests asked about it on a mutant of 0.33.0."""
    from kvspec.emit.vllm_tests import SUITE

    files, failed = list(SUITE), failed_here if failed_here is not None else caught
    return {"asked": True, "files": files, "caught_by": caught, "command": "pytest " + " ".join(files),
            "subject": {"against": "vllm 0.33.0 + refloor_50062", "outcome": "failed" if failed else "passed",
                        "passed": 313 - len(failed), "tests": 313, "failed": failed, "errors": [],
                        "seconds": 17.0},
            "baseline": {"against": "unmutated vllm 0.33.0", "outcome": "passed", "passed": 313, "tests": 313,
                         "failed": [], "errors": [], "reused": reused, "recorded": "2026-12-06 17:27 UTC"}}


def assert_ruff_clean_as_vllm_lints(code: str, tmp_path: Path, file_name: str) -> None:
    """``code`` passes ``ruff check`` and ``ruff format --check`` under vLLM's
    configuration (0.33.0's, kept as a fixture), vLLM's modules first-party
    as in its repository (stand-in packages beside the file)."""
    import re
    import subprocess

    from ruff.__main__ import find_ruff_bin

    (tmp_path / "pyproject.toml").write_text((FIXTURES / "vllm-0.33.0-ruff.toml").read_text())
    for module in re.findall(r"^from (vllm[\w.]*) import", code, re.M):
        package = tmp_path.joinpath(*module.split("."))
        package.mkdir(parents=True, exist_ok=True)
        (package / "__init__.py").write_text("")
    (tmp_path / file_name).write_text(code)
    for args in (["check", "--no-cache", "--output-format", "concise"], ["format", "--no-cache", "--check", "--diff"]):
        run = subprocess.run([str(find_ruff_bin()), *args, file_name], capture_output=True, text=True, cwd=tmp_path)
        assert run.returncode == 0, run.stdout + run.stderr


def assert_no_discrepancy_but_known(run: dict) -> None:
    """A registration or lookup run's JSON came out clean: no discrepancy,
    apart from the known vLLM bugs of its release it met and recognised,
    which its verdict names."""
    from kvspec.model.known import known_bugs

    assert run["verdict"].startswith("no discrepancy") and run["failure"] is None, run["verdict"]
    carried = {b.name for b in known_bugs(run["subject"].get("vllm_version"))}
    assert set(run["known_met"]) <= carried, run["known_met"]
    assert all(name in run["verdict"] for name in run["known_met"]), run["verdict"]


def engine_findings_of_every_kind() -> list:
    """A finding of every kind an engine test is written for (the 0.34.0
    Mamba-estimate fixture recast, no KV connector), free_order by each part
    (on one full-attention group where the kind asks for it), and the
    evicted-block finding of kvspec's own connector."""
    import json

    import attrs

    from kvspec.emit.engine_test import ENGINE_TEST_KINDS
    from kvspec.emit.stateful_test import FREE_ORDER_HEAD, FREE_ORDER_PARTS
    from kvspec.model.finding import Category, Finding

    fixtures = Path(__file__).parent / "fixtures"
    base = Finding.from_dict(json.loads((fixtures / "finding_engine_mamba_estimate_0.34.0.json").read_text()))
    settings = {k: v for k, v in base.run["engine_settings"].items() if k != "kv_connector"}
    base = attrs.evolve(base, category=Category.STATE_LEAK, run={**base.run, "engine_settings": settings})
    parts = {**FREE_ORDER_PARTS, "head": FREE_ORDER_HEAD}
    one_group = {**base.run, "engine_settings": {**settings, "groups": settings["groups"][2:]}}
    out = []
    for category in ENGINE_TEST_KINDS:
        if category is Category.STATE_FREE_ORDER:
            out += [(f"free_order {part}", attrs.evolve(base, category=category, detail=f"free_order: {words}"))
                    for part, (words, _, _) in parts.items()]
        elif category is Category.STATE_RETENTION_HIT:
            out.append((category.value, attrs.evolve(base, category=category, detail="request r0: a hit of 0 "
                                                     "tokens; retention owes at least 64, r1's replay boundary")))
        else:
            run = one_group if category is Category.STATE_HIT_LENGTH else base.run
            out.append((category.value, attrs.evolve(base, category=category, run=run)))
    # kvspec's connector written into the test (its only findings: a failed load's evictions)
    evicted = fixtures / "finding_engine_evicted_findable_0.34.0.json"
    out.append(("evicted_findable, kvspec's connector", Finding.from_dict(json.loads(evicted.read_text()))))
    return out
