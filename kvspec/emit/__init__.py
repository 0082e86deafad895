"""Test emitters: a finding as a regression test in vLLM's idiom
(``regression_test``, ``stateful_test``), with the release's own test
helpers and ruff configuration to write and lint it against
(``vllm_tests``).  They write Python source from validated finding fields;
they never import the finding producers (``kvspec.findings``) or the
renderers (``kvspec.report``)."""
