"""The subject against a direct transcription of its intent, on a small domain.

The transcription searches for boundaries instead of using floor arithmetic,
so it shares no formula with the subject: a future hit lands on a multiple of
S (any token under partial hits); register the largest such prefix; an EAGLE
group also one block past it, never past the finalized tokens, and only
once a boundary above zero exists.
"""

import itertools

from kvspec.model.arith import INT
from kvspec.model.spec import BoundaryInputs, registration_bound


def largest_hit_boundary(x: int, S: int, partial: bool) -> int:
    return max(m for m in range(0, x + 1) if partial or m % S == 0)


def intended(n, S, H, B, L, eagle, partial):
    reprefillable = L - 1 if L > 1 else 0
    finalized = n - reprefillable if n > reprefillable else 0
    boundary = largest_hit_boundary(n, S, partial)
    if eagle and boundary > 0:
        lookahead_end = largest_hit_boundary(finalized, S, partial) + B
        return finalized if finalized < lookahead_end else lookahead_end
    return boundary


def small_domain():
    for H, m, k in itertools.product((1, 2, 3), (1, 2), (1, 2, 3)):
        B, S = m * H, k * m * H
        for eagle, partial in itertools.product((False, True), repeat=2):
            if partial and not H < S:
                continue
            for L in range(0, (S if eagle else 2 * S) + 1):
                for n in range(0, 3 * S + 3):
                    yield n, S, H, B, L, eagle, partial


def test_spec_matches_intent_exhaustively():
    checked = 0
    for args in small_domain():
        n, S, H, B, L, eagle, partial = args
        p = BoundaryInputs(n=n, S=S, H=H, B=B, L=L, eagle=eagle, partial=partial)
        assert registration_bound(INT, p) == intended(*args), args
        checked += 1
    assert checked > 5000  # the domain is not accidentally empty
