"""kvspec's pytest plugin (entry point ``pytest11: kvspec``).

A vLLM contributor runs kvspec's differential tests against their own vLLM
with plain pytest::

    pytest --pyargs kvspec.diff_tests.test_differential --kvspec-vllm-src ~/vllm \\
           --kvspec-profile nightly --junitxml=kvspec.xml

The plugin is loaded by every pytest run in an environment where kvspec is
installed, vLLM's own suite included, so it stays import-light (pytest and the
standard library only) and changes nothing unless a kvspec option is given or
a test asks for a ``kvspec_*`` fixture: a Hypothesis profile is loaded on
``--kvspec-profile`` at start-up, or from ``KVSPEC_PROFILE`` when a test first
uses a kvspec fixture (so the variable alone never changes another project's
settings), and subjects start only when a test uses ``kvspec_subject``.

Statistics (subject, examples, differential cases, cache_blocks calls,
discrepancies, profile) go into each test's ``user_properties``, which
pytest's JUnit XML writes as ``<property>`` elements.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import pytest

# The releases the differential tests use when no subject option is given
# (kvspec's own CI provisions exactly these).
DEFAULT_RELEASES = ("0.28.0", "0.33.0")
PROFILES = {"dev": 200, "ci": 2000, "nightly": 50_000}  # max_examples per profile


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kvspec", "kvspec differential tests against real vLLM")
    group.addoption("--kvspec-vllm", action="append", default=[], metavar="VERSION",
                    help="a vLLM release from PyPI as the subject (repeatable; provisioned on first use)")
    group.addoption("--kvspec-vllm-src", action="append", default=[], metavar="PATH",
                    help="a directory holding the vllm package: a checkout or PR tree (repeatable)")
    group.addoption("--kvspec-current", action="store_true",
                    help="the vLLM importable in this environment as the subject")
    group.addoption("--kvspec-profile", choices=sorted(PROFILES), default=None,
                    help="Hypothesis profile for this run: dev (200 examples), ci (2000), "
                         "nightly (50000); default $KVSPEC_PROFILE, else Hypothesis's own settings")
    group.addoption("--kvspec-database", default=None, metavar="DIR|redis://HOST:PORT[/DB]",
                    help="Hypothesis example database shared with `kvspec fuzz` runs: a directory, "
                         "or a Redis server for a fleet")


class _State:
    """What this run chose, resolved once at configure time."""

    def __init__(self, config: pytest.Config) -> None:
        self.releases = list(config.getoption("kvspec_vllm"))
        self.trees = list(config.getoption("kvspec_vllm_src"))
        self.current = bool(config.getoption("kvspec_current"))
        self.profile = config.getoption("kvspec_profile")
        self.database = config.getoption("kvspec_database")
        self.live: dict[str, Any] = {}  # subject label -> SubjectProcess
        self.loaded = False  # a kvspec Hypothesis profile is in force
        # A --kvspec-* option was given: kvspec's markers and header are this run's.
        self.asked = bool(self.releases or self.trees or self.current or self.profile is not None
                          or self.database is not None)
        self.used = False  # a test used a kvspec fixture

    @property
    def subject_ids(self) -> list[str]:
        ids = [f"vllm-{v}" for v in self.releases] + [f"src:{p}" for p in self.trees]
        if self.current:
            ids.append("current")
        return ids or [f"vllm-{v}" for v in DEFAULT_RELEASES]


_STATE_KEY = pytest.StashKey[_State]()


def pytest_configure(config: pytest.Config) -> None:
    state = _State(config)
    config.stash[_STATE_KEY] = state
    # For tests that cannot take fixtures (the stateful differential's classes).
    from kvspec.diff_tests import session

    session.configure(state.subject_ids, lambda subject_id: _live(config, subject_id),
                      lambda subject_id: _spec(subject_id).label)
    if state.asked:
        _register_markers(config)
    if state.profile is not None or state.database is not None:
        # Only on request: a plain pytest run of vLLM's own suite is untouched.
        load_profile(state.profile or "dev", state.database)
        state.loaded = True


_MARKERS = ("vllm: drives a real vLLM subject (provisioned on first use)",)


def _register_markers(config: pytest.Config) -> None:
    """kvspec's markers, only in a run that is kvspec's (another project's
    --strict-markers still catches a misspelt marker of its own)."""
    for line in _MARKERS:
        if line not in config.getini("markers"):
            config.addinivalue_line("markers", line)


@functools.lru_cache(maxsize=1)
def _shipped_tests() -> str | None:
    """The folder of kvspec's shipped differential tests (without importing them)."""
    from importlib.util import find_spec

    try:
        spec = find_spec("kvspec.diff_tests")
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or ()) if spec is not None else []
    return os.path.realpath(locations[0]) if locations else None


def pytest_collect_file(file_path, parent) -> None:
    # A module of kvspec's shipped tests is about to be imported
    # (``pytest --pyargs kvspec.diff_tests...``): its markers must be known first.
    if file_path.suffix != ".py":
        return None
    folder = _shipped_tests()
    if folder is not None and os.path.realpath(file_path).startswith(folder + os.sep):
        _register_markers(parent.config)
    return None


def _use(config: pytest.Config) -> "_State":
    """A kvspec fixture is being used: ``KVSPEC_PROFILE`` may apply now."""
    state = config.stash[_STATE_KEY]
    state.used = True
    _register_markers(config)
    if not state.loaded:
        name = os.environ.get("KVSPEC_PROFILE")
        if name:
            if name not in PROFILES:
                pytest.fail(f"KVSPEC_PROFILE={name!r} is not a kvspec profile; use one of "
                            f"{', '.join(sorted(PROFILES))}", pytrace=False)
            load_profile(name)
            state.profile = name
        state.loaded = True
    return state


def load_profile(name: str, database: str | None = None) -> None:
    """Register kvspec's profiles and make ``name`` Hypothesis's default."""
    from hypothesis import HealthCheck, settings

    extra: dict[str, Any] = {}
    if database is not None:
        from kvspec.diff_tests.database import example_database
        from kvspec.model.errors import KvspecError

        try:
            extra["database"] = example_database(database)
        except KvspecError as exc:
            raise pytest.UsageError(f"--kvspec-database: {exc}") from None
    # Real vLLM calls are slow by Hypothesis's standards and kvspec_stats is
    # function-scoped on purpose (one count per test); nested_given stays on,
    # which coverage-guided engines (HypoFuzz) require.
    quiet = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large,
             HealthCheck.filter_too_much, HealthCheck.large_base_example]
    # Parent is Hypothesis's "default" profile, not whatever is loaded: on a CI
    # machine Hypothesis loads its own "ci" profile (derandomize=True, no
    # database), which would make kvspec-ci replay the same examples on every
    # run and HypoFuzz refuse the tests. A kvspec profile means the same anywhere.
    base = settings.get_profile("default")
    for profile, examples in PROFILES.items():
        settings.register_profile(f"kvspec-{profile}", parent=base, max_examples=examples, deadline=None,
                                  suppress_health_check=quiet, print_blob=True, **extra)
    settings.load_profile(f"kvspec-{name}")


def _header(state: "_State") -> str:
    profile = state.profile or "hypothesis defaults"
    return f"kvspec: profile {profile}; subjects {', '.join(state.subject_ids)}"


def pytest_report_header(config: pytest.Config) -> str | None:
    state = config.stash.get(_STATE_KEY, None)
    if state is None or not state.asked:  # another project's run is left as it is
        return None
    return _header(state)


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    # A run that used kvspec's fixtures without an option still says what it ran against.
    state = config.stash.get(_STATE_KEY, None)
    if state is not None and state.used and not state.asked:
        terminalreporter.write_line(_header(state))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "kvspec_subject" in metafunc.fixturenames:
        ids = metafunc.config.stash[_STATE_KEY].subject_ids
        metafunc.parametrize("kvspec_subject", ids, ids=ids, indirect=True, scope="session")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    state = config.stash.get(_STATE_KEY, None)
    if state is not None and any(name.startswith("kvspec_") for item in items
                                 for name in getattr(item, "fixturenames", ())):
        state.used = True  # the run's summary names kvspec's profile and subjects
    # Hypothesis keys a parametrized test's database by node id (as HypoFuzz
    # always does) only when it sees a parametrize marker; the subject
    # parametrization comes from the hook above, so say so on the item. Then a
    # failure either engine saves is the other's first replay.
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and "kvspec_subject" in callspec.params:
            item.add_marker(pytest.mark.parametrize(
                "kvspec_subject", [callspec.params["kvspec_subject"]], indirect=True))


def _spec(subject_id: str):
    from kvspec.subjects.subject import current_environment, release, source_tree

    if subject_id == "current":
        return current_environment()
    if subject_id.startswith("src:"):
        return source_tree(subject_id[len("src:"):])
    return release(subject_id[len("vllm-"):])


def _live(config: pytest.Config, subject_id: str):
    """One worker per subject for the whole session, started on first use."""
    from kvspec.model.errors import KvspecError
    from kvspec.subjects.process import SubjectProcess

    state = _use(config)
    if subject_id not in state.live:
        try:
            state.live[subject_id] = SubjectProcess(_spec(subject_id))
        except KvspecError as exc:
            # A setup error, stated once: the tests must not pass without a subject.
            pytest.fail(f"kvspec: subject {subject_id}: {exc}", pytrace=False)
    return state.live[subject_id]


@pytest.fixture(scope="session")
def kvspec_subject(request: pytest.FixtureRequest):
    """A live worker driving the chosen vLLM (one per subject for the session)."""
    return _live(request.config, request.param)


@pytest.fixture(scope="session")
def kvspec_release(request: pytest.FixtureRequest):
    """``kvspec_release("0.33.0")``: the session's live worker for that release."""
    return lambda version: _live(request.config, f"vllm-{version}")


@pytest.fixture
def kvspec_stats(request: pytest.FixtureRequest, kvspec_subject):
    """Counters a differential test fills in; written to the JUnit XML.

    A Hypothesis test that used it and did not fail is then checked (see
    ``pytest_runtest_call``).  While the test runs, its examples do not depend
    on which other modules the session imported (``diff_tests.seeding``)."""
    from kvspec.diff_tests.property import Tally
    from kvspec.diff_tests.seeding import fixed_constant_pool

    state = _use(request.config)
    stats = Tally()
    with fixed_constant_pool():
        yield stats
    properties = request.node.user_properties
    properties.append(("kvspec_subject", kvspec_subject.subject.label))
    properties.append(("kvspec_vllm_version", kvspec_subject.identity.get("vllm_version")))
    properties.append(("kvspec_profile", state.profile or "hypothesis defaults"))
    for key, value in stats.as_dict().items():
        properties.append((f"kvspec_{'cache_blocks_' if key == 'calls' else ''}{key}", value))
    properties.append(("kvspec_known_met", stats.known_met_text()))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    """After a Hypothesis test that filled ``kvspec_stats`` ran without
    failing: every example of its budget must have run (``examples``
    counted by the test), so a property that returned early or drew nothing
    cannot pass vacuously; and the known vLLM bugs its examples met and
    recognised are said (XFAIL), never passed."""
    result = yield  # a failing test raised here: nothing to add
    stats = getattr(item, "funcargs", {}).get("kvspec_stats")
    if stats is None or not hasattr(item.obj, "hypothesis"):
        return result
    from kvspec.diff_tests.hypothesis_compat import settings_of

    shortfall = stats.shortfall(settings_of(item.obj).max_examples)
    if shortfall is not None:
        pytest.fail(shortfall, pytrace=False)
    if stats.known_met:
        subject = item.funcargs["kvspec_subject"].subject.label
        pytest.xfail(f"known vLLM bug(s) of {subject} met and recognised (model/known.py): "
                     f"{stats.known_met_text()}; the whole budget ran and nothing else broke")
    return result


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    state = session.config.stash.get(_STATE_KEY, None)
    if state is None:
        return
    for proc in state.live.values():
        proc.close()
    state.live.clear()
