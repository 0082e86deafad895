"""Stored findings, read back from files kvspec did not necessarily write.

Findings are CI artifacts that reviewers replay and render, so a file is
untrusted input: it is parsed as JSON and validated by the finding model's
own types before use, it never names code to import or run, and anything
malformed is an ``InputError`` naming the file and the field.
"""

from __future__ import annotations

import json
from pathlib import Path

from kvspec.model.errors import InputError
from kvspec.model.finding import Finding

from .finding import render_markdown, render_text

__all__ = ["load_findings"]

MAX_BYTES = 64 << 20  # a finding is kilobytes; refuse to parse anything absurd


def load_findings(path: str) -> list[Finding]:
    """The findings in a stored finding file, a ``kvspec fuzz --json`` result
    or a ``kvspec prove --json`` result; an InputError when there are none."""
    try:
        size = Path(path).stat().st_size
        if size > MAX_BYTES:
            raise InputError(f"{path}: {size} bytes is not a kvspec finding")
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InputError(f"cannot read finding {path}: {exc}") from None
    except RecursionError:  # JSON nested deeper than the parser goes
        raise InputError(f"cannot read finding {path}: nested too deep to be a kvspec finding") from None
    if not isinstance(doc, dict):
        raise InputError(f"{path} is not a kvspec finding or result (a JSON {type(doc).__name__})")
    schema = str(doc.get("schema", ""))
    if schema.startswith("kvspec.finding/"):  # from_dict says which versions it reads
        raw = [doc]
    elif schema.startswith("kvspec.fuzz/"):
        subjects = doc.get("subjects")
        if not isinstance(subjects, list):
            raise InputError(f"{path}: a fuzz result without a list of subjects")
        raw = [s["finding"] for s in subjects if isinstance(s, dict) and s.get("finding")]
    elif schema.startswith("kvspec.prove/"):
        raw = doc.get("findings") or []
    else:
        raise InputError(f"{path} is not a kvspec finding or result (schema {schema!r}); "
                         "findings are stored under .kvspec/findings by `kvspec fuzz`")
    if not raw:
        raise InputError(f"{path} holds no finding")
    try:
        findings = [Finding.from_dict(d) for d in raw]
        # Fields the model reads lazily are read now: what a report or a
        # replay would trip over later is a malformed file, said once, here.
        for finding in findings:
            render_text(finding)
            render_markdown(finding)
    except (TypeError, ValueError, KeyError, AttributeError, IndexError, RecursionError) as exc:
        raise InputError(f"{path}: malformed finding ({type(exc).__name__}: {exc})") from None
    return findings
