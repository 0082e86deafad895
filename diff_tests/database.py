"""Where Hypothesis keeps the examples every later run replays first.

A plain path is a directory database (Hypothesis's own format: it can be
committed, copied between machines or cached by CI). ``redis://HOST:PORT[/DB]``
is a Redis server shared by a fleet, through Hypothesis's own
``RedisExampleDatabase``: a failure found on any machine is replayed first on
every other one.
"""

from __future__ import annotations

from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase

__all__ = ["DatabaseError", "example_database"]

REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


class DatabaseError(Exception):
    """The example database cannot be used: a one-line cause and what to do."""


def example_database(location: str) -> ExampleDatabase | None:
    """The database at ``location`` ('' for none); a Redis server is pinged
    now, so an unreachable one is a setup error, not a silent loss."""
    if not location:
        return None
    if not location.startswith(REDIS_SCHEMES):
        return DirectoryBasedExampleDatabase(location)
    try:
        import redis
        from hypothesis.extra.redis import RedisExampleDatabase
    except ImportError:
        raise DatabaseError(
            f"the example database {location} needs the Redis client: pip install 'kvspec[redis]'"
        ) from None
    client = redis.Redis.from_url(location)
    try:
        client.ping()
    except redis.RedisError as exc:
        raise DatabaseError(f"cannot reach the example database {location} ({exc}); "
                            "start the server or pass a directory with --database") from None
    return RedisExampleDatabase(client, key_prefix=b"kvspec-example:")
