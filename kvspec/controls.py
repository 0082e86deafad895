"""A recorded control run, reused: the unmutated release fuzzed beside its mutants
(and, by the same rule, other runs on a release tree that depend on nothing else).

``kvspec fuzz --vllm V --mutant M`` fuzzes release V first as a control.  A
fuzz run is a function of the release's tree, kvspec's code, the runtime,
the seed, the budget, the hash schemes and differentials, and the saved
failures the example database replays first; when all of those are as they
were for a recorded clean control, its result is reused instead of fuzzing
the release again, and every output says so ("control: vllm 0.33.0, reused
from DATE").  Only a clean, complete run is recorded: a control that found a
discrepancy, stopped early or ran a reduced scope always runs again.

The example database is fingerprinted by its entries (a directory database's
file names are digests of their contents).  A record keeps every state of
the database under which the release's own saved failures were those the
recorded run replayed: the state it started from, and the state at the end
of the command that ran it (the other subjects' failures added, the
release's unchanged since it found none).  A Redis database is never
fingerprinted, so a control there always runs.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

import attrs

__all__ = ["is_control", "control_key", "database_state", "recall", "remember", "add_database_state",
           "recorded_value", "reused_sentence"]

_VERSION = 1  # of the record's layout


def is_control(subject, subjects: list) -> bool:
    """A release fuzzed beside a mutant made from it."""
    return subject.kind == "release" and any(
        s.kind == "mutant" and s.version == subject.version for s in subjects)


def _kvspec_code() -> str:
    """The digest of kvspec's own sources (every layer): a change to the code
    is a new key, whatever the version number says."""
    import kvspec

    root = Path(kvspec.__file__).resolve().parent
    digest = hashlib.sha256()
    for folder, dirs, files in sorted(os.walk(root, followlinks=True)):
        dirs.sort()
        for name in sorted(files):
            if name.endswith(".py"):
                path = Path(folder) / name
                digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def control_key(subject, settings, differential: str) -> dict[str, Any]:
    """Everything a control run's result depends on, but the database."""
    from kvspec.model.about import versions
    from kvspec.subjects.provision import tree_digest
    from kvspec.subjects.subject import resolve_subject

    python, tree = resolve_subject(subject)
    return {"layout": _VERSION, "release": subject.version, "differential": differential,
            "seed": settings.seed, "max_examples": settings.max_examples, "jobs": settings.jobs,
            "hash_schemes": list(settings.hash_schemes) if settings.hash_schemes else "all",
            "include_known": settings.include_known, "versions": versions(), "kvspec_code": _kvspec_code(),
            "runtime": python, "tree": tree_digest(Path(tree))}


def database_state(location: str) -> str | None:
    """A fingerprint of the example database's saved entries ("none" without
    one; None when it cannot be taken: never reused then)."""
    if not location:
        return "none"
    if "://" in location:
        return None
    root = Path(location)
    if not root.exists():
        return hashlib.sha256(b"").hexdigest()
    if not root.is_dir():
        return None
    digest = hashlib.sha256()
    for folder, dirs, files in sorted(os.walk(root)):
        dirs.sort()
        for name in sorted(files):
            digest.update(os.path.relpath(os.path.join(folder, name), root).encode() + b"\n")
    return digest.hexdigest()


def _path(key: dict[str, Any]) -> Path:
    from kvspec.subjects.provision import cache_root

    name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
    return cache_root() / "controls" / f"{key['release']}-{name}.json"


def _write(path: Path, record: dict[str, Any]) -> None:
    """Atomically; a record that cannot be written is only not reused later."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.partial")
        partial.write_text(json.dumps(record, indent=1, sort_keys=True))
        os.replace(partial, path)
    except OSError:
        pass


def recall(key: dict[str, Any], state: str | None) -> tuple[Any, str] | None:
    """The recorded clean result for ``key`` under database ``state``, and
    when it was recorded (None: none to reuse)."""
    from kvspec.diff_tests.fuzz import FuzzResult
    from kvspec.diff_tests.property import Tally
    from kvspec.model.capabilities import Capabilities

    if state is None:
        return None
    try:
        record = json.loads(_path(key).read_text())
        if record.get("key") != key or state not in record.get("database_states", ()):
            return None
        r = record["result"]
        if r["verdict"] != "no discrepancy" or r["stopped"] or r["failure"] or r["scope_reduction"]:
            return None  # never recorded so; checked again all the same
        result = FuzzResult(subject=r["subject"], capabilities=Capabilities.from_dict(r["capabilities"]),
                            seed=r["seed"], tally=Tally(**r["tally"]), seconds=r["seconds"], jobs=r["jobs"],
                            lookup=r["lookup"], hash_schemes=tuple(r["hash_schemes"]["fuzzed"]),
                            schemes_left_out=tuple(r["hash_schemes"]["left_out"]),
                            deployment_configs=r["deployments"]["configs"],
                            deployments_note=r["deployments"]["note"])
        return result, record["recorded"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def remember(key: dict[str, Any], state: str | None, result) -> None:
    """Record a clean, complete control run (anything else is not recorded)."""
    if state is None or result.failure is not None or result.stopped is not None or result.scope_reduction \
            or result.other_failures:
        return
    _write(_path(key), {"key": key, "database_states": [state],
                        "recorded": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                        "result": {**result.as_dict(), "tally": attrs.asdict(result.tally)}})


def add_database_state(key: dict[str, Any], state: str | None) -> None:
    """The database at the end of the command that ran or reused the
    control: the release's saved failures are as the control left them."""
    path = _path(key)
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if state is not None and state not in record.get("database_states", []):
        record["database_states"] = [*record.get("database_states", []), state][-8:]
        _write(path, record)


def recorded_value(kind: str, subject, inputs: dict[str, Any], compute,
                   keep=lambda value: True) -> tuple[Any, str | None]:
    """``compute()`` for a run on a release (or a mutant) that depends only
    on its tree, the runtime, kvspec's code and ``inputs``: recorded once
    (when ``keep`` says the value may be), then reused.  The value and, when
    reused, when it was recorded."""
    from kvspec.model.about import versions
    from kvspec.subjects.provision import tree_digest
    from kvspec.subjects.subject import resolve_subject

    python, tree = resolve_subject(subject)
    key = {"layout": _VERSION, "kind": kind, "release": subject.version, "inputs": inputs, "versions": versions(),
           "kvspec_code": _kvspec_code(), "runtime": python, "tree": tree_digest(Path(tree))}
    path = _path(key)
    try:
        record = json.loads(path.read_text())
        if record.get("key") == key:
            return record["value"], record["recorded"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    value = compute()
    if keep(value):
        _write(path, {"key": key, "value": value, "recorded": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())})
    return value, None


def reused_sentence(label: str, recorded: str) -> str:
    return (f"control: {label}, reused from {recorded} (same seed, budget, hash schemes, kvspec code, runtime "
            "and release tree; its example database entries unchanged)")
