import os
import sys

# Make the top-level packages (model, proofs, oracles, ...) importable from a
# plain checkout, whichever test directory pytest starts in.
ROOT = os.path.dirname(os.path.abspath(__file__))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
