"""Code that runs on vLLM's side of the process boundary: inside a subject's
runtime, next to the vLLM tree under test.

Modules here import only the standard library, vLLM and, of kvspec, the
standard-library modules of ``kvspec.model`` written for this side
(``model.wire``: the requests and their parse) -- never attrs, z3, Hypothesis
or the rest of kvspec: the runtime need not have them.  The worker
(``subjects/worker.py`` starts it; its code is here, split by role: ``loop``,
``manager_driver``, ``state_machine``, ``engine``, ``introspection``,
``errors``) and the deployment probe load this package through the
``kvspec`` namespace they set up (``load_kvspec_namespace``).
"""
