"""The worker's loop (stdlib + vLLM + ``model.wire`` only): one JSON request
per line in, one JSON reply per line out.  Each line is parsed once
(``model.wire.parse_request``: the requests ``model.requests`` sends) and
answered by the handler its ``op`` names (``HANDLERS``), which reads the
parsed request's fields; a line that is not a request the protocol allows is
answered with kvspec's error.

A handler turns what vLLM raised into the reply that says so: a vLLM
exception is a finding, reported whole with its traceback and whose frames
raised it (``errors.exception_origin``); a release that cannot do what was
asked is ``unsupported``; a message kvspec should not have sent is kvspec's
error, never vLLM's.  Every error reply says which in ``error_kind``
(``errors.error_reply``).
"""

import json
import time
import traceback

from kvspec.model.wire import MalformedRequest, parse_request

from .errors import (CONSTRUCT, DRIVE, ENVIRONMENT, FATAL, KVSPEC, UNSUPPORTED, BadOperation, Rejected, Unsupported,
                     error_reply, exception_origin, raised)
from .introspection import mamba_layer_checkpoint_fields
from .manager_driver import Driver, prefill_chunks
from .state_machine import Machine

__all__ = ["HANDLERS", "serve"]


def serve(lines, send):
    """Answer requests from ``lines`` through ``send`` until ``quit`` or the
    end of input; the first reply is the hello.  Returns the exit status."""
    try:
        driver = Driver()
    except Exception as exc:  # the subject cannot even be imported
        send(error_reply(FATAL, raised(exc), traceback=traceback.format_exc()))
        return 1
    send({"ok": True, "capabilities": driver.capabilities})
    for line in lines:
        try:
            request = parse_request(json.loads(line))
        except ValueError as exc:  # not JSON, or not a request (MalformedRequest)
            send(_malformed(exc))
            continue
        if request.op == "quit":
            break
        HANDLERS[request.op](driver, request, send)
    return 0


def _malformed(exc):
    """kvspec's error: a line that is not a request the protocol allows."""
    if isinstance(exc, MalformedRequest):
        return error_reply(KVSPEC, str(exc))
    return error_reply(KVSPEC, "a request is one JSON object per line (%s)" % exc)


def _stream(driver, request, send):
    """One line per case as soon as it is done, so the caller compares case i
    while this process drives case i + 1; then an end marker."""
    for case in request.cases:
        send(_run_one(driver, case))
    send({"ok": True, "done": True})


def _run_one(driver, case):
    started = time.perf_counter()
    try:
        reply = {"ok": True, **driver.run(case)}
    except Unsupported as exc:
        reply = error_reply(UNSUPPORTED, str(exc))
    except Rejected as exc:
        reply = error_reply(CONSTRUCT, str(exc), traceback=traceback.format_exc())
    except BaseException as exc:  # a vLLM exception is a finding, reported whole
        reply = error_reply(DRIVE, raised(exc), traceback=traceback.format_exc(), **exception_origin(exc))
    reply["seconds"] = time.perf_counter() - started
    return reply


def _prefill_chunks_op(driver, request):
    try:
        return prefill_chunks(driver, request.case, request.prompts)
    except Unsupported as exc:
        return error_reply(UNSUPPORTED, str(exc))
    except BaseException as exc:
        return error_reply(DRIVE, raised(exc), traceback=traceback.format_exc())


def _machine_op(driver, request):
    """The stateful differential: a manager opened, then operations applied in
    order, each answered with what it returned and the state after it.  A vLLM
    exception stops the batch and is reported whole with the operation's index."""
    if request.op == "machine_trace":
        if driver.machine is None:
            return error_reply(KVSPEC, "no machine is open")
        return {"ok": True, "trace": driver.machine.trace}
    if request.op == "machine_ops" and driver.machine is None:  # kvspec's error (a fresh worker), not vLLM's
        return error_reply(KVSPEC, "no machine is open on this worker")
    if request.op == "open_machine":
        try:
            driver.machine = Machine(driver, request.case)
        except Unsupported as exc:
            return error_reply(UNSUPPORTED, str(exc))
        except ImportError as exc:  # the runtime lacks a module vLLM imports: the machine's, not vLLM's
            return error_reply(ENVIRONMENT, raised(exc))
        except BaseException as exc:  # vLLM refused the configuration
            return error_reply(CONSTRUCT, raised(exc), traceback=traceback.format_exc(), **exception_origin(exc))
        machine = driver.machine
        return {"ok": True, "state": machine.snapshot(), "groups": len(machine.groups),
                # What this vLLM lets the machine do, and the retention it took.
                "operations": {"evict": hasattr(machine.manager, "evict_blocks"),
                               "reset": hasattr(machine.manager, "reset_prefix_cache")},
                "retention_interval": getattr(machine.coordinator, "retention_interval", None)}
    answers = []
    for index, op in enumerate(request.ops):
        try:
            answers.append(driver.machine.apply(op, request.observe))
        except Unsupported as exc:
            return error_reply(UNSUPPORTED, str(exc), answers=answers)
        except BadOperation as exc:
            return error_reply(KVSPEC, str(exc), index=index, answers=answers)
        except BaseException as exc:  # a vLLM exception mid-sequence is a finding, reported whole
            return error_reply(DRIVE, raised(exc), index=index, traceback=traceback.format_exc(), answers=answers,
                               **exception_origin(exc))
    return {"ok": True, "answers": answers}


def _engine_op(driver, request):
    """The engine differential: a real Scheduler built (``open_engine``), then
    operations applied in order, each answered with what the step observed and
    the manager's state after it.  An exception raised in vLLM's frames stops
    the batch and is reported whole (a finding); one raised in kvspec's own
    frames is kvspec's error, never vLLM's."""
    from .engine import EngineMachine

    if request.op == "open_engine":
        driver.engine = None
        try:
            driver.engine = EngineMachine(request.setup)
        except Unsupported as exc:
            return error_reply(UNSUPPORTED, str(exc))
        except ImportError as exc:
            return error_reply(ENVIRONMENT, raised(exc))
        except BaseException as exc:  # vLLM's configuration code refused the setup
            return error_reply(CONSTRUCT, raised(exc), traceback=traceback.format_exc(), **exception_origin(exc))
        engine = driver.engine
        return {"ok": True, "derived": engine.derived, "state": engine.reader.snapshot()}
    if getattr(driver, "engine", None) is None:
        return error_reply(KVSPEC, "no engine is open (the worker was restarted, or none was built)")
    answers = []
    for index, op in enumerate(request.ops):
        try:
            answers.append(driver.engine.apply(op, request.observe))
        except BaseException as exc:
            origin = exception_origin(exc)
            extra = {"allocations": driver.engine.allocations} if origin["origin"] == "vllm" else {}
            return error_reply(DRIVE if origin["origin"] == "vllm" else KVSPEC, raised(exc), index=index,
                               traceback=traceback.format_exc(), answers=answers, **origin, **extra)
    return {"ok": True, "answers": answers}


def _session_op(driver, request):
    try:
        if request.op == "open_session":
            return driver.open_session(request.case)
        return driver.session_actions(request.actions)
    except Unsupported as exc:
        return error_reply(UNSUPPORTED, str(exc))
    except BaseException as exc:  # a vLLM exception mid-replay is reported whole
        return error_reply(DRIVE, raised(exc), traceback=traceback.format_exc(), **exception_origin(exc))


def _stats(driver, request):
    return {"ok": True, "cases": driver.serial, "managers_built": driver.managers_built,
            "reuse_managers": driver.reuse_managers}


def _one(handler):
    """A handler answered with one reply."""
    def answer(driver, request, send):
        send(handler(driver, request))
    answer.__name__ = handler.__name__
    return answer


# Each request's handler, by its ``op`` (every op of ``model.wire.OPS`` but
# ``quit``): called with the driver, the parsed request and ``send`` (a
# stream sends a reply per case, every other request one).
HANDLERS = {
    "run": _one(lambda driver, request: _run_one(driver, request.case)),
    "stream": _stream,
    "open_session": _one(_session_op),
    "session_actions": _one(_session_op),
    "prefill_chunks": _one(_prefill_chunks_op),
    "mamba_layer_checkpoint_fields": _one(lambda driver, request: {"ok": True,
                                                                   "fields": mamba_layer_checkpoint_fields()}),
    "open_machine": _one(_machine_op),
    "machine_ops": _one(_machine_op),
    "machine_trace": _one(_machine_op),
    "open_engine": _one(_engine_op),
    "engine_ops": _one(_engine_op),
    "stats": _one(_stats),
}
