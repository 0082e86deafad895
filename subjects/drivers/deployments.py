"""What each deployment profile gets on a release, from the release's own
configuration code: runs ``subjects/deployment_probe.py`` in the subject's
runtime and turns its answers into ``model.deployments.Derivation`` values.

A probe run imports vLLM once and derives every profile (seconds each), so
its answers are cached per release tree and per catalog
(``$KVSPEC_CACHE/deployments``); a tree's content digest is part of the key,
so a changed tree is probed again.  Where the release's code cannot derive a
profile (it rejects the configuration, or a step this release lacks), the
answer says why and ``model.deployments.derive`` models it instead.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import time
from pathlib import Path


from kvspec.model.deployments import CATALOG, Derivation, Profile, derive, from_probe, schemes_for

from ..subject import Subject, interpreter_args, release, resolve_subject, subject_env

__all__ = ["PROBE", "probe_release", "derivations", "ProbeResult"]

PROBE = Path(__file__).resolve().parent.parent / "deployment_probe.py"
# Modules the probe imports before it installs its platform stand-in.
PREIMPORT = (
    "vllm.model_executor.models.qwen3_next", "vllm.model_executor.models.qwen3_next_mtp",
    "vllm.model_executor.models.nemotron_h", "vllm.model_executor.models.granitemoehybrid",
    "vllm.model_executor.models.falcon_h1", "vllm.model_executor.models.jamba",
    "vllm.model_executor.models.gpt_oss", "vllm.model_executor.models.gemma3",
    "vllm.model_executor.models.llama", "vllm.model_executor.models.llama_eagle3",
    "vllm.model_executor.layers.mamba.mamba_mixer", "vllm.model_executor.layers.mamba.mamba_mixer2",
    "vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn",
    "vllm.model_executor.layers.attention.attention",
)


class ProbeResult(dict):
    """``release_facts`` and per (profile, legacy_hashes) the probe's answer."""


def _kvspec_paths() -> list[str]:
    import kvspec.model
    import kvspec.subjects

    return sorted({str(Path(p.__file__).resolve().parent.parent) for p in (kvspec.model, kvspec.subjects)})


def _cache_file(subject: Subject, root: str | None, profiles: tuple[Profile, ...]) -> Path | None:
    from ..provision import cache_root, tree_digest

    if root is None:
        return None
    payload = json.dumps([p.to_probe() for p in profiles], sort_keys=True).encode()
    digest = hashlib.sha256(payload + PROBE.read_bytes()
                            + tree_digest(Path(root)).encode()).hexdigest()[:16]
    name = (subject.version or Path(root).name).replace("/", "_")
    return cache_root() / "deployments" / f"{name}-{digest}.json"


def probe_release(subject: Subject, profiles: tuple[Profile, ...] = CATALOG, *, timeout: float = 1800.0,
                  use_cache: bool = True) -> ProbeResult:
    """Every profile derived by the subject's own configuration code (a
    mutant is probed on the release it was made from: its mutation is in the
    coordinator, not in the configuration code)."""
    if subject.kind == "mutant":
        subject = release(subject.version)
    python, root = resolve_subject(subject)
    cache = _cache_file(subject, root, profiles) if use_cache else None
    if cache is not None and cache.exists():
        return ProbeResult(json.loads(cache.read_text()))
    messages = []
    for p in profiles:
        entry = p.to_probe()
        entry["schemes"] = [False, True] if p.drafter is not None else [False]
        messages.append(entry)
    options = {"kvspec_paths": _kvspec_paths(), "profiles": messages, "preimport": list(PREIMPORT)}
    started = time.perf_counter()
    out = subprocess.run([python, *interpreter_args(root), "-W", "ignore", str(PROBE), json.dumps(options)],
                         capture_output=True, text=True, env=subject_env(root), timeout=timeout)
    result = ProbeResult(results={}, release_facts=None, seconds=round(time.perf_counter() - started, 1),
                         subject=subject.label)
    for line in out.stdout.splitlines():
        if not line.startswith("{"):
            continue
        answer = json.loads(line)
        if "fatal" in answer:
            result["fatal"] = answer["fatal"]
        elif "release_facts" in answer:
            result["release_facts"] = answer["release_facts"]
        else:
            result["results"][f"{answer['profile']}|{'legacy' if answer['legacy_hashes'] else 'default'}"] = answer
    if out.returncode != 0 and not result["results"]:
        tail = " | ".join((out.stderr or "").strip().splitlines()[-3:])
        result["fatal"] = result.get("fatal") or f"the probe failed (exit {out.returncode}): {tail}"
    if cache is not None and "fatal" not in result:
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps(result, indent=1, sort_keys=True))
    return result


def derivations(subject: Subject, version: str, profiles: tuple[Profile, ...] = CATALOG,
                probed: ProbeResult | None = None) -> list[Derivation]:
    """Each profile under each hash scheme the release offers it, from the
    release's own code where the probe derived it, else modelled (the
    derivation's steps say which)."""
    if probed is None:
        probed = probe_release(subject, profiles)
    out = []
    for p in profiles:
        for legacy in schemes_for(p, version):
            answer = probed.get("results", {}).get(f"{p.name}|{'legacy' if legacy else 'default'}")
            modelled = derive(p, version, legacy_hashes=legacy)
            if answer is not None and answer.get("ok"):
                out.append(from_probe(p, version, legacy, answer, modelled))
            else:
                why = (answer or {}).get("unsupported") or (answer or {}).get("error") or probed.get("fatal") \
                    or "the probe gave no answer"
                out.append(modelled.because_not_called(why))
    return out


