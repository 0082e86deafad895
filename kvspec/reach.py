"""Which real deployments reach a finding (see ``model.finding.Reach``).

Filled in by the deployment-profile work (issue 20); until then no finding
says who is affected, and reports say so.
"""

from __future__ import annotations

__all__: list[str] = []
