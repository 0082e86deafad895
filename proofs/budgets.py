"""The proofs' default budgets, apart from the runner so that the command
line can show them in ``--help`` without importing Z3."""

from __future__ import annotations

__all__ = ["DEFAULT_RLIMIT", "SAFETY_NET_S"]

# Resource units per solver check.  Measured on the whole catalog with its
# vacuity checks (z3 5.4.1, seed 0, three runs, idle and with two CPU-bound
# processes competing): the most any single check spent was 25-31 million
# (a refuter of reachability.regression_blocks), most spend under 100
# thousand; ten times the most is the budget.
DEFAULT_RLIMIT = 300_000_000
# Wall-clock seconds per check, only as a safety net (the budget ends checks
# long before on any working machine).
SAFETY_NET_S = 600.0
