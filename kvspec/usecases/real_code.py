"""The symbolic leg: each subject's own registration code checked against the subject."""

from __future__ import annotations

from kvspec.usecases import Say, print_line

__all__ = ["real_code"]


def real_code(subjects: list, *, timeout_s: float = 60.0, say: Say = print_line) -> list:
    """The symbolic leg: each subject's own registration code against the subject."""
    from kvspec.subjects.symbolic import symbolic_check

    verdicts = []
    for subject in subjects:
        verdict = symbolic_check(subject, timeout=timeout_s)
        verdicts.append(verdict)
        say(f"  {subject.label}: {verdict.status.value} {verdict.target} ({verdict.detail}; "
            f"{verdict.paths} paths, {verdict.seconds:.1f} s symbolic, {verdict.wall_seconds:.1f} s in all)")
        cx = verdict.counterexample
        if cx:
            args_text = ", ".join(f"{k}={v}" for k, v in cx["args"].items())
            say(f"    counterexample: {args_text}: vLLM {cx['real']}, subject {cx['spec']}")
            if cx["replay"].get("case"):
                say(f"    replayed as: {cx['replay']['case']}")
        for note in verdict.abstracted:
            say(f"    abstracted: {note}")
    return verdicts

