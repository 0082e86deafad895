"""Settings profiles and real-vLLM subject fixtures for the differential tests.

Profiles: ``dev`` (default: quick), ``ci`` (loaded automatically when CI is
set), ``nightly`` (long).  Choose with ``KVSPEC_PROFILE``.  The subjects are
real vLLM releases, provisioned on first use: these tests never skip.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

from oracles.subject import SubjectProcess, release

SUPPORTED_IN_CI = ("0.28.0", "0.33.0")

_COMMON = dict(deadline=None, suppress_health_check=list(HealthCheck), print_blob=True)
settings.register_profile("dev", max_examples=200, **_COMMON)
settings.register_profile("ci", max_examples=2000, **_COMMON)
settings.register_profile("nightly", max_examples=50_000, **_COMMON)
PROFILE = os.environ.get("KVSPEC_PROFILE") or ("ci" if os.environ.get("CI") else "dev")
settings.load_profile(PROFILE)


def pytest_report_header(config):
    return f"kvspec: hypothesis profile {PROFILE!r} ({settings().max_examples} examples); subjects {', '.join(SUPPORTED_IN_CI)}"


_live: dict[str, SubjectProcess] = {}


def live_subject(version: str) -> SubjectProcess:
    """One worker per release for the whole session (started on first use)."""
    if version not in _live:
        _live[version] = SubjectProcess(release(version))
    return _live[version]


@pytest.fixture(scope="session", params=SUPPORTED_IN_CI)
def subject(request) -> SubjectProcess:
    return live_subject(request.param)


def pytest_sessionfinish(session, exitstatus):
    for proc in _live.values():
        proc.close()
