"""Hypothesis strategies for well-formed single-group inputs (toolkit tests)."""

from hypothesis import strategies as st

from model.spec import BoundaryInputs


@st.composite
def boundary_inputs(draw, max_block: int = 6, max_tokens: int = 200) -> BoundaryInputs:
    H = draw(st.integers(1, max_block))
    B = H * draw(st.integers(1, max_block))
    S = B * draw(st.integers(1, max_block))
    eagle = draw(st.booleans())
    partial = draw(st.booleans()) and H < S
    L = draw(st.integers(0, S if eagle else 3 * S))
    n = draw(st.integers(0, max_tokens))
    return BoundaryInputs(n=n, S=S, H=H, B=B, L=L, eagle=eagle, partial=partial)
