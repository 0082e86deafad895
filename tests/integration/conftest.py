"""The differential tests' fixtures come from kvspec's pytest plugin
(``kvspec/pytest_plugin.py``: ``kvspec_subject``, ``kvspec_release``,
``kvspec_stats``, the ``--kvspec-*`` options and the Hypothesis profiles), so
that they work the same from this checkout and with ``pytest --pyargs``.
The releases CI provisions are the plugin's ``DEFAULT_RELEASES``."""
