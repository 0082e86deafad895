"""The subject-side worker: runs inside a vLLM runtime, drives vLLM's own code.

Started by ``subjects/process.py`` as ``python -I worker.py`` with the
subject tree in ``KVSPEC_SUBJECT_TREE`` (put first on ``sys.path`` here, never
through ``PYTHONPATH``).  It imports only the standard library, vLLM and
``kvspec.model.wire`` (stdlib only: it must run on any supported release),
reads one JSON request per line on stdin and answers one JSON line on a
private pipe: vLLM's logging and any print go to stderr, so they can never
corrupt the protocol (``subjects/protocol.py`` describes the messages).

This file only sets the process up; the worker's code is split by role in
``subjects/vllm_side/``: ``loop`` (the requests' handlers, by ``op``),
``manager_driver`` (a ``KVCacheManager`` built for a case and driven as the
scheduler drives it, with what it observes), ``state_machine`` (the
scheduler's moves for the stateful differential), ``engine`` (a real
``Scheduler`` for the engine differential), ``introspection`` (what this
vLLM can do, the hello) and ``errors`` (the worker's exceptions and whose
frames raised one).

Importing this module has no side effects: the symbolic harness and the
deployment probe reuse ``use_subject_tree`` in the same runtime.
"""

import os
import sys


def load_kvspec_namespace():
    """Make ``kvspec.subjects.vllm_side`` importable here: the runtime has no
    kvspec installed, so a bare ``kvspec`` namespace is pointed at the folder
    holding this file's package (the checkout's root, or the installed
    ``kvspec`` folder).  A process that set one up already keeps it."""
    import types

    if "kvspec" not in sys.modules:
        namespace = types.ModuleType("kvspec")
        namespace.__path__ = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
        sys.modules["kvspec"] = namespace


def use_subject_tree():
    """Put the tree kvspec names first on sys.path (before vLLM is imported)."""
    tree = os.environ.get("KVSPEC_SUBJECT_TREE")
    if tree:
        sys.path.insert(0, tree)


def main():
    # The protocol gets a private copy of stdout; fd 1 then points at stderr.
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    use_subject_tree()
    load_kvspec_namespace()
    import json

    from kvspec.subjects.vllm_side.loop import serve

    def send(message):
        protocol.write(json.dumps(message) + "\n")
        protocol.flush()

    return serve(sys.stdin, send)


if __name__ == "__main__":
    code = main()
    # Every reply is flushed and nothing here needs finalising; the teardown
    # of torch and vLLM at interpreter exit takes seconds (4 s at load 4,
    # measured), paid by every worker a run or the suite closes.
    sys.stderr.flush()
    os._exit(code or 0)
