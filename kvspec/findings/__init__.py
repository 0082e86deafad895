"""Finding producers: a failure or a refuted theorem assembled into a
``model.finding.Finding`` (``assemble``), completed while its subject is
still live and stored (``completion``, ``stateful``, ``engine``), with what
vLLM's own tests say of it (``vllm_suite``).  They drive subjects and write
files; rendering a finding is ``kvspec.report``'s, emitting a test ``kvspec.emit``'s."""
