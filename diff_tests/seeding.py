"""A seed means the same examples whatever else the process has imported.

Recent Hypothesis releases also draw, now and then, integers and strings
found in the source of every *local* module loaded so far (its "local
constants"), and the pool grows as modules are imported.  So one seed
generated different examples in `kvspec fuzz`, in `kvspec check` (which has
loaded the proof catalog by then), in each row of `kvspec history` (the
first release's run precedes the symbolic imports), and in pytest depending
on which test files were collected: measured on 0.33.0, 200 examples of
seed 0 were 5,905 cases, and 7,161 once the proof modules were imported.

While kvspec generates, that pool is pinned to empty.  Hypothesis's global
constants (its boundary values) still apply, and so does everything else.
The hook is Hypothesis-internal, so it is looked up, never assumed: on a
Hypothesis without it there is nothing to pin.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def fixed_constant_pool() -> Iterator[None]:
    """Within this block, Hypothesis draws no constants from local modules."""
    try:
        from hypothesis.internal.conjecture import providers
    except ImportError:  # pragma: no cover - layout of other Hypothesis versions
        yield
        return
    current = getattr(providers, "_get_local_constants", None)
    cache = getattr(getattr(providers, "CONSTANTS_CACHE", None), "cache", None)
    constants = getattr(providers, "Constants", None)
    if current is None or cache is None or constants is None:
        yield
        return
    empty = constants()
    providers._get_local_constants = lambda: empty
    cache.clear()  # entries computed from the growing pool
    try:
        yield
    finally:
        providers._get_local_constants = current
        cache.clear()
