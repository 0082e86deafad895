"""Code that runs on vLLM's side of the process boundary: inside a subject's
runtime, next to the vLLM tree under test.

Modules here import only the standard library and vLLM (never attrs, z3,
Hypothesis or the rest of kvspec): the runtime has none of them.  The worker
(``subjects/worker.py`` starts it; its code is here, split by role: ``loop``,
``manager_driver``, ``state_machine``, ``engine``, ``introspection``,
``errors``) and the deployment probe load this package through the
``kvspec`` namespace they set up (``load_kvspec_namespace``).
"""
