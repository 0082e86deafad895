"""Exit codes, shared by every subcommand."""

OK = 0  # everything as expected / no discrepancy
FINDING = 1  # something refuted that should hold, or a discrepancy
USAGE = 2  # usage, input or setup error
UNKNOWN = 3  # a proof timed out or the solver gave up: no conclusion
