"""Where Hypothesis keeps the examples every later run replays first.

A plain path is a directory database (Hypothesis's own format: it can be
committed, copied between machines or cached by CI). ``redis://HOST:PORT[/DB]``
is a Redis server shared by a fleet, through Hypothesis's own
``RedisExampleDatabase``: a failure found on any machine is replayed first on
every other one.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase, ReadOnlyDatabase

from kvspec.model.errors import SetupError

__all__ = ["DatabaseError", "example_database"]

REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


class DatabaseError(SetupError):
    """The example database cannot be used: a one-line cause and what to do."""


def example_database(location: str) -> ExampleDatabase | None:
    """The database at ``location`` ('' for none); a Redis server is pinged
    now, so an unreachable one is a setup error, not a silent loss."""
    if not location:
        return None
    if not location.startswith(REDIS_SCHEMES):
        return _directory(Path(location))
    try:
        import redis
        from hypothesis.extra.redis import RedisExampleDatabase
    except ImportError:
        raise DatabaseError(
            f"the example database {location} needs the Redis client: pip install 'kvspec[redis]'"
        ) from None
    try:
        client = redis.Redis.from_url(location)
    except ValueError as exc:
        raise DatabaseError(f"--database {location}: not a Redis URL ({exc}); "
                            "use redis://HOST:PORT/DB") from None
    try:
        client.ping()
    except redis.RedisError as exc:
        raise DatabaseError(f"cannot reach the example database {location} ({exc}); "
                            "start the server or pass a directory with --database") from None
    return RedisExampleDatabase(client, key_prefix=b"kvspec-example:")


def _directory(path: Path) -> ExampleDatabase:
    """A directory database; one kvspec cannot write to is still replayed,
    read-only, and the user is told that new failures will not be kept."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        pass  # an existing folder may still be read
    writable = os.access(path, os.W_OK | os.X_OK)
    if not path.is_dir():
        raise DatabaseError(f"--database {path}: not a directory kvspec can create")
    database = _CheckedDirectory(str(path))
    if writable:
        return database
    print(f"kvspec: warning: the example database {path} is not writable: its saved failures are "
          "replayed, but failures found now will not be saved", file=sys.stderr, flush=True)
    return ReadOnlyDatabase(database)


class _CheckedDirectory(DirectoryBasedExampleDatabase):
    """Hypothesis's directory database drops a write that fails (a full
    disk) without a word, and may leave an empty file: each save is read
    back, and the first that did not land is warned about, once."""

    warned = False

    def save(self, key: bytes, value: bytes) -> None:
        super().save(key, value)
        if not self.warned and value not in set(self.fetch(key)):
            self.warned = True
            print(f"kvspec: warning: the example database {self.path} could not save a failing example "
                  "(a full disk?): failures found now may not be replayed by later runs", file=sys.stderr,
                  flush=True)
