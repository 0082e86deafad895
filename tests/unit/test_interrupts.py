"""An interrupt is an interrupt however Hypothesis reports it."""

from __future__ import annotations

from kvspec.diff_tests.fuzz import interrupt_behind


def _hypothesis_like() -> None:
    # Hypothesis 6.157's engine, interrupted before its runner exists, asserts
    # on the way out: the interrupt survives only as the assertion's context.
    try:
        raise KeyboardInterrupt
    except BaseException:
        runner = None
        assert runner is not None


def test_an_interrupt_hypothesis_turned_into_an_assertion_is_still_an_interrupt():
    try:
        _hypothesis_like()
    except AssertionError as error:
        assert interrupt_behind(error)
    else:
        raise AssertionError("the stand-in did not raise")


def test_an_assertion_without_aninterrupt_behind_it_is_not_one():
    try:
        raise AssertionError("a real failure")
    except AssertionError as error:
        assert not interrupt_behind(error)
    chained = ValueError("outer")
    chained.__cause__ = RuntimeError("inner")
    assert not interrupt_behind(chained)


def test_sigterm_and_sighup_end_a_command_as_an_interrupt(monkeypatch, capsys):
    import os
    import signal

    from kvspec import cli
    from kvspec.model.outcome import Outcome

    for name in ("SIGTERM", "SIGHUP"):
        def command(args, name=name):
            os.kill(os.getpid(), getattr(signal, name))
            for _ in range(10**7):  # the handler runs between bytecodes
                pass
            raise AssertionError(f"{name} did not interrupt the command")

        before = signal.getsignal(getattr(signal, name))
        monkeypatch.setattr(cli.argparse.ArgumentParser, "parse_args",
                            lambda self, argv=None: __import__("argparse").Namespace(run=command))
        assert cli.main(["fuzz"]) == Outcome.INTERRUPTED.exit_code
        assert f"kvspec: interrupted by {name}" in capsys.readouterr().err
        assert signal.getsignal(getattr(signal, name)) is before  # given back after the command


def test_an_interrupt_swallowed_inside_the_run_still_exits_interrupted(monkeypatch, capsys):
    import os
    import signal

    from kvspec import cli
    from kvspec.model.outcome import Outcome

    def command(args):
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(10**7):
                pass
        except KeyboardInterrupt:  # as a gc callback or a library might
            pass
        return Outcome.OK

    monkeypatch.setattr(cli.argparse.ArgumentParser, "parse_args",
                        lambda self, argv=None: __import__("argparse").Namespace(run=command))
    assert cli.main(["fuzz"]) == Outcome.INTERRUPTED.exit_code
    assert "went on past it" in capsys.readouterr().err


def test_jobs_are_capped_at_a_few_per_cpu(capsys):
    import os

    from kvspec.arguments import JOBS_PER_CPU
    from kvspec.cli import main
    from kvspec.model.outcome import Outcome

    too_many = str(JOBS_PER_CPU * (os.cpu_count() or 1) + 1)
    for command in (["exhaust", "--current"], ["fuzz", "--current"]):
        assert main([*command, "--jobs", too_many]) == Outcome.USAGE.exit_code
        err = capsys.readouterr().err.strip().splitlines()
        assert "at most" in err[-1] and "jobs on this machine" in err[-1]


def test_a_database_write_that_fails_warns_once(tmp_path, monkeypatch, capsys):
    import errno
    import tempfile

    from kvspec.diff_tests.database import example_database

    database = example_database(str(tmp_path / "db"))

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tempfile, "mkstemp", full)
    database.save(b"key", b"one")
    database.save(b"key", b"two")
    err = capsys.readouterr().err
    assert err.count("could not save a failing example") == 1
    monkeypatch.undo()
    fresh = example_database(str(tmp_path / "db2"))
    fresh.save(b"key", b"three")
    assert "could not save" not in capsys.readouterr().err and list(fresh.fetch(b"key")) == [b"three"]


def test_an_interrupt_lost_in_a_finalizer_stops_the_next_request_to_a_worker(monkeypatch, capsys):
    """Python drops an exception raised inside ``__del__`` ("Exception
    ignored"): a stop signal handled there is lost as an exception.  The
    request is kept, and the next request to a worker raises it again, so the
    run starts nothing more (a run that fuzzed a second release to its end
    after Ctrl-C, seen once under load, is what this prevents)."""
    import gc
    import os
    import signal

    from kvspec import cli
    from kvspec.model.outcome import Outcome
    from kvspec.model.requests import Stats
    from kvspec.subjects.process import SubjectProcess

    class Finalized:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(10**6):  # the handler runs here, inside the finalizer
                pass

    sent, dropped = [], []
    monkeypatch.setattr("sys.unraisablehook", lambda unraisable: dropped.append(unraisable.exc_type))

    def command(args):
        holder = Finalized()
        holder.cycle = holder
        del holder
        gc.collect()  # the finalizer runs, the interrupt raised in it is dropped
        sent.append("the run went on")
        proc = SubjectProcess.__new__(SubjectProcess)  # a worker never started: nothing must reach it
        proc._send(Stats())
        sent.append("a request was sent after the stop")
        return Outcome.OK

    monkeypatch.setattr(cli.argparse.ArgumentParser, "parse_args",
                        lambda self, argv=None: __import__("argparse").Namespace(run=command))
    assert cli.main(["fuzz"]) == Outcome.INTERRUPTED.exit_code
    err = capsys.readouterr().err
    assert dropped == [KeyboardInterrupt]  # Python dropped the interrupt itself
    assert sent == ["the run went on"]
    assert "kvspec: interrupted by SIGTERM" in err
    # The request ends with the run: the next run starts clean.
    from kvspec.subjects import stop

    assert stop.requested() == []
