"""A stateful program's nearest engine configurations, and its operations as engine inputs.

A stateful finding (``diff_tests/stateful.py``) is on a ``KVCacheConfig``
kvspec built by hand; the engine differential (``diff_tests/engine.py``)
builds its manager from engine flags through the release's own code.  To
say whether a stateful finding is reachable through vLLM's scheduler,
kvspec replays it through the engine (``diff_tests/reproduce.py``) on the
configurations here: the toy model whose layer layout has the finding's
group kinds, the flags that match the program's settings where vLLM has one
(prefix caching off, a retention interval, the admission gate, EAGLE drafts,
external tokens through kvspec's own connector), and a pool of about the
program's token capacity.  Nothing here claims the engine builds the
program's geometry: vLLM chooses the block sizes (a scheduler block of 2
over a window of 2 is not one it builds), so the engine's geometry is the
nearest one it builds, and the translation of the operations is the nearest
one the engine takes (``translate``'s notes say what was dropped).

Pure: no vLLM here.
"""

from __future__ import annotations

import re
from typing import Any

import attrs

from .domain import GroupKind, HashScheme
from .engine import MAX_MTP_MODULES, OWN_CONNECTOR, QWEN3_NEXT_TOYS, TOY_MODELS, EngineProgram, EngineSetup
from .case import MAX_TOKENS
from .program import Program

__all__ = ["MAX_MODEL_LEN", "PRESSURE_ID", "ENGINE_FORMS", "nearest_setups", "translate", "scale_for", "reproduction_reach", "group_kind",
           "Target", "preempt_points", "pressure_pool", "pressure_trial", "after_preemption", "program_of_case",
           "mechanism_kind"]

# The engine's model length for a reproduction: the stateful draw's 128 tokens
# plus room for decoded tokens and drafts past it.
MAX_MODEL_LEN = 256
# The request that puts the pool under pressure when a program's preemption is
# translated (``pressure_trial``): it holds blocks and grows until the engine
# preempts the program's request, then is aborted.
PRESSURE_ID = "pressure"


# The lookup differential's categories (``oracles.lookup``: one later
# request's hit on a hand-built manager) and the rules the engine holds every
# lookup through the real Scheduler to (``model.state``): the same rules of a
# hit, said over the manager's state.  A contract's hit off the landing
# points or leaving no token to compute is ``hit_bounds``; one needing blocks
# nothing registered, or a group holding another block count than the hit,
# is ``hit_groups``; a hit other than the leading run of registered blocks
# (one-group full attention) is ``hit_length``, which is also the exact hit
# of a full-attention layout; a hit shorter than an earlier request kept is
# ``retention_hit``.
ENGINE_FORMS: dict[str, tuple[str, ...]] = {
    "lookup_contract": ("state_hit_bounds", "state_hit_groups", "state_hit_length"),
    "hit_mismatch": ("state_hit_length", "state_hit_groups", "state_retention_hit"),
}


@attrs.frozen
class Target:
    """The mechanism a reproduction must show: the broken invariant's
    category (its value), the group kind it names (None: it names none), and
    for a crash the exception's type.  A lookup finding's category is shown
    through the engine by the lookup rules the engine holds every hit to
    (``ENGINE_FORMS``)."""

    category: str
    kind: str | None = None
    exception: str | None = None

    def shown_by(self, category: str) -> bool:
        """Whether a discrepancy of ``category`` through the engine is this mechanism's."""
        return category == self.category or category in ENGINE_FORMS.get(self.category, ())

    def describe(self) -> str:
        where = f" in a {self.kind} group" if self.kind else ""
        raised = f" ({self.exception})" if self.exception else ""
        forms = ENGINE_FORMS.get(self.category)
        through = f", shown through the engine as {' or '.join(forms)}" if forms else ""
        return f"{self.category}{where}{raised}{through}"


_GROUP = re.compile(r"\bgroup (\d+)\b")


def group_kind(detail: str, kinds: list[str]) -> str | None:
    """The kind of the first group a discrepancy's detail names (None: none named or out of range)."""
    match = _GROUP.search(detail or "")
    if match is None:
        return None
    index = int(match.group(1))
    return kinds[index] if index < len(kinds) else None


def mechanism_kind(found, kinds: list[str]) -> str | None:
    """The kind of the group a discrepancy is about: for a registration
    one, the first group whose tokens or blocks differ from the spec's; else
    the group kind its rule names (``model.state.Violation``), else the
    first group its detail names (None: none).  A lookup discrepancy's
    tokens are one hit, not a group's: its group is the one its detail names."""
    expected, observed = tuple(found.expected_tokens or ()), tuple(found.observed_tokens or ())
    if expected and observed and found.category.value not in ENGINE_FORMS:
        pairs = list(zip(expected, observed))
        if expected == observed:
            pairs = list(zip(found.expected_blocks or (), found.observed_blocks or ()))
        for index, (want, got) in enumerate(pairs):
            if want != got and index < len(kinds):
                return kinds[index]
    if getattr(found, "group_kinds", ()):
        return found.group_kinds[0].value
    return group_kind(found.detail, kinds)


def program_of_case(case) -> Program:
    """A registration case (one request's steps on a geometry, maybe a later
    request's lookup) as a stateful program, so that it is looked for
    through the engine as a stateful finding is: the writer arrives with its
    prompt, one scheduler step a case step (a prefill chunk is the step's
    token budget; a decode carries its drafts), then the lookup's request
    (the writer's prompt tokens it shares, and its own) and one step."""
    ops: list[dict[str, Any]] = [{"do": "arrive", "id": "r0", "tokens": list(range(1, case.prompt_len + 1))}]
    for step in case.steps:
        if step.kind == "prefill":
            ops.append({"do": "schedule", "budget": step.tokens})
        elif step.drafts:
            ops.append({"do": "schedule", "drafts": step.drafts, "accepted": step.accepted})
        else:
            ops.append({"do": "schedule"})
    if case.probe is not None:
        shared = min(case.probe.shared, case.prompt_len)
        ops.append({"do": "arrive", "id": "r1",
                    "tokens": list(range(1, shared + 1)) + [50_000 + i for i in range(case.probe.extra)]})
        ops.append({"do": "schedule"})
    # The pool is no part of a registration case: about two longest requests.
    S = case.config.scheduler_block_size
    pool = len(case.config.groups) * -(-2 * case.max_model_len // S)
    return Program(case.config, min(pool, 2 * MAX_TOKENS), min(case.max_model_len, 2 * MAX_TOKENS), ops,
                   num_hash_lookahead_tokens=case.config.num_hash_lookahead_tokens)


def _model_len(program: Program) -> int:
    """The engine's model length for the program: ``MAX_MODEL_LEN``, or room
    for its longest prompt and a few tokens past it (a registration case's
    prompt may be longer), in whole ``MAX_MODEL_LEN`` units."""
    longest = max([len(op.get("tokens", ())) for op in program.ops] + [0]) + 64
    return max(1, -(-longest // MAX_MODEL_LEN)) * MAX_MODEL_LEN


def _models_for(program: Program) -> list[str]:
    """The toy models whose layouts carry the program's group kinds, nearest first."""
    kinds = {g.kind for g in program.config.groups}
    models = []
    if _full_attention_blocks(program) > 1:
        # Full-attention groups of two block sizes: the toy Qwen3-Next's engine
        # with its EAGLE3 drafter builds them (the drafter's group half the
        # target's block), beside its Mamba groups.
        models.append("toy-qwen3-next-eagle3")
    if GroupKind.MAMBA_ALIGN in kinds and any(g.eagle for g in program.config.groups):
        # Drafts over Mamba groups: the toy Qwen3-Next, with an EAGLE3 drafter
        # of its own KV page (the drafter's group a block unlike the others)
        # and with its own MTP module.
        models += ["toy-qwen3-next-eagle3", "toy-qwen3-next"]
    if GroupKind.MAMBA_ALIGN in kinds:
        models.append("toy-nemotron-h")
    if GroupKind.SLIDING_WINDOW in kinds:
        models.append("toy-gpt-oss")
    if not models or kinds == {GroupKind.FULL_ATTENTION}:
        models.append("toy-llama")
    return list(dict.fromkeys(models))


def _full_attention_blocks(program: Program) -> int:
    """How many block sizes the program's full-attention groups have."""
    return len({g.block_size for g in program.config.groups if g.kind is GroupKind.FULL_ATTENTION})


def _pool(program: Program, toy, block: int) -> int:
    """About the program's pool in tokens, in engine blocks; at least what one
    longest engine request needs (vLLM refuses a smaller pool)."""
    attention = 1 + any(kind.startswith("sliding") for kind in toy.layers)
    need = attention * -(-_model_len(program) // block) + 2 + 2 * sum(kind == "mamba" for kind in toy.layers)
    S = program.config.scheduler_block_size
    per_group = program.num_blocks // max(1, len(program.config.groups))
    return max(need, -(-per_group * S // block) * attention)


def nearest_setups(program: Program, plain: bool = False) -> tuple[list[EngineSetup], list[str]]:
    """The engine configurations nearest the program's geometry (nearest
    first), and what about the geometry no engine configuration carries.
    ``plain``: the finding names no group (a crash outside any group's
    rule), so the plain full-attention layout is searched too."""
    notes: list[str] = []
    config = program.config
    eagle = any(g.eagle for g in config.groups)
    external = any(op.get("external") for op in program.ops)
    evicts = any(op["do"] == "evict" for op in program.ops)
    budgets = sorted({op["budget"] for op in program.ops if op.get("budget")})
    setups: list[EngineSetup] = []
    models = _models_for(program)
    if plain and "toy-llama" not in models:
        models.append("toy-llama")
        notes.append("the finding names no group: the plain full-attention layout (toy-llama) searched too")
    for name in models:
        toy = next(m for m in TOY_MODELS if m.name == name)
        S = config.scheduler_block_size
        block = (16 if S <= 16 else 32) if toy.attention_block else None
        unit = block or 16
        flags: dict[str, Any] = {"model": name, "max_model_len": _model_len(program), "block_size": block}
        if not config.enable_caching and not toy.hybrid:
            flags["prefix_caching"] = False
        if program.retention_interval is not None and (toy.hybrid or "sliding" in "".join(toy.layers)):
            flags["retention_interval"] = -(-program.retention_interval // unit) * unit
        if not program.reserve_full_sequence:
            flags["reserve_full_isl"] = False
        # The drafter is what gives the Qwen3-Next toy its second full-attention group.
        drafter = toy.drafter is not None and _full_attention_blocks(program) > 1
        if toy.spec_method is not None and (eagle or drafter):
            flags["num_speculative_tokens"] = max([op.get("drafts", 0) for op in program.ops] + [1])
            if eagle and config.hash_scheme is not HashScheme.LOOKAHEAD:
                flags["legacy_hashes"] = True  # the EAGLE drop live, as on the hand-built manager
            if toy.spec_method == "mtp" and eagle and config.num_prefill_lookahead > 1:
                # A prefill lookahead past 1 is multi-module MTP's: as many MTP
                # modules and drafts (vLLM derives the lookahead from them; the
                # engine's run reads back what it derived).
                modules = min(config.num_prefill_lookahead, MAX_MTP_MODULES)
                flags.update(num_nextn_predict_layers=modules, num_speculative_tokens=modules)
                if config.num_prefill_lookahead > MAX_MTP_MODULES:
                    notes.append(f"prefill lookahead {config.num_prefill_lookahead} becomes {modules} (the most MTP "
                                 f"modules the toy Qwen3-Next is given)")
        if name in QWEN3_NEXT_TOYS and config.hash_block_size < config.scheduler_block_size:
            flags["prefix_match_unit"] = 16  # partial hash hits, as the program's finer hash block gives
        if external:
            flags["kv_connector"] = OWN_CONNECTOR
        pool = _pool(program, toy, unit)
        nearest = EngineSetup(num_gpu_blocks=pool, **flags)
        setups.append(nearest)
        if evicts:
            # vLLM evicts cached blocks on a failed synchronous KV load, and only
            # under its default policy ('fail': the request fails, its blocks
            # leave the cache); under 'recompute' it keeps them and recomputes
            # from the failed block, as the program's evict truncated the
            # request's computed tokens: both are tried, the evicting one first.
            setups.append(attrs.evolve(nearest, kv_connector=OWN_CONNECTOR, kv_load_failure_policy=None))
            setups.append(attrs.evolve(nearest, kv_connector=OWN_CONNECTOR, kv_load_failure_policy="recompute"))
        if budgets and budgets[0] >= 8:
            # A step's token budget is a setting of the engine, not of a step: the smallest the program used.
            setups.append(attrs.evolve(nearest, max_num_batched_tokens=budgets[0]))
        # The same layout with the release's defaults and a tighter pool (preemption, eviction).
        defaults = EngineSetup(model=name, num_gpu_blocks=_pool(attrs.evolve(program, num_blocks=1), toy, unit),
                               max_model_len=_model_len(program), block_size=block)
        if defaults != nearest:
            setups.append(defaults)
    kinds = {g.kind for g in config.groups}
    if GroupKind.MAMBA_ALIGN in kinds and GroupKind.SLIDING_WINDOW in kinds:
        notes.append("no toy model has both a sliding-window and a Mamba group: each searched apart")
    if eagle and not any(s.num_speculative_tokens for s in setups):
        notes.append("EAGLE groups: no toy model with a drafter has this layout")
    blocks = sorted({g.block_size for g in config.groups})
    notes.append(f"the program's blocks {blocks} (S={config.scheduler_block_size}) become the engine's own "
                 f"(vLLM chooses them: {', '.join(sorted({s.model + ' ' + str(s.block_size or 'release default') for s in setups}))})")
    windows = sorted({g.sliding_window for g in config.groups if g.kind is GroupKind.SLIDING_WINDOW})
    if windows:
        notes.append(f"sliding window {windows} becomes toy-gpt-oss's 32")
    return setups, notes


def scale_for(program: Program, setup: EngineSetup) -> int:
    """How many engine tokens stand for one of the program's so that its
    prompts cover as many blocks as they did (the engine's block over the
    program's scheduler block), as far as the model length allows; 1: none."""
    block = setup.block_size or 16
    longest = max([len(op.get("tokens", ())) for op in program.ops] + [1])
    return max(1, min(block // program.config.scheduler_block_size, (MAX_MODEL_LEN - 16) // longest))


def translate(program: Program, setup: EngineSetup, scale: int = 1) -> tuple[EngineProgram, list[str]]:
    """The program's operations as engine inputs on ``setup``, and what was
    not translated: arrivals (the same tokens, each repeated as ``scale``
    distinct tokens, so the same prefix structure and resends) with enough
    output tokens to run until the program finished them, scheduler steps as
    engine steps (drafts where the engine has a drafter), finishes as aborts,
    resets; an eviction (the blocks from a drawn one on lose their hashes) as
    a load kvspec's connector fails from that block at the request's
    admission, on a setup with that connector (vLLM evicts cached blocks on a
    failed KV load under its default policy only; it reports failures on
    one-group layouts only).  A
    preemption happens in the engine only under pool pressure: it is not sent
    here (``pressure_trial`` makes it)."""
    dropped: dict[str, int] = {}
    ops: list[dict[str, Any]] = []
    finished_at: dict[str, int] = {}
    evicted_from: dict[str, int] = {}
    for index, op in enumerate(program.ops):
        if op["do"] == "finish":
            finished_at.setdefault(op["id"], index)
        if op["do"] == "evict":
            evicted_from.setdefault(op["id"], int(op.get("from_block", 0)))
    # The program's block b starts at token b * S; stretched by ``scale``, in the engine's blocks.
    engine_block = setup.block_size or 16
    S = program.config.scheduler_block_size
    steps_after = [sum(o["do"] == "schedule" for o in program.ops[i:]) for i in range(len(program.ops))]
    for index, op in enumerate(program.ops):
        kind = op["do"]
        if kind == "arrive":
            # Enough output tokens that the request is still running when the
            # program finishes it (a step emits at most one token and its drafts).
            end = finished_at.get(op["id"], len(program.ops))
            steps = sum(o["do"] == "schedule" for o in program.ops[index:end])
            per_step = 1 + (setup.num_speculative_tokens or 0)
            wanted = (steps + 1) * per_step + 1 if op["id"] in finished_at else steps_after[index] + 1
            max_tokens = max(1, min(wanted, MAX_MODEL_LEN))
            tokens = [t * scale + j for t in op["tokens"] for j in range(scale)]
            arrival: dict[str, Any] = {"do": "arrive", "id": op["id"], "tokens": tokens, "max_tokens": max_tokens}
            if op.get("external") and setup.kv_connector == OWN_CONNECTOR:
                offer = min(len(tokens) - 1, op["external"] * scale)
                if offer > 0:
                    arrival["load"] = {"offer": offer, "async": False, "delay": 0, "fail": None}
            if op["id"] in evicted_from and setup.kv_connector == OWN_CONNECTOR and len(tokens) > 1:
                fail = evicted_from[op["id"]] * S * scale // engine_block
                load = arrival.setdefault("load", {"offer": len(tokens) - 1, "async": False, "delay": 0,
                                                   "fail": None})
                load["fail"] = fail
            ops.append(arrival)
        elif kind == "schedule":
            step: dict[str, Any] = {"do": "step"}
            if setup.num_speculative_tokens and op.get("drafts"):
                drafts = min(op["drafts"], setup.num_speculative_tokens)
                step.update(drafts=drafts, accepted=min(op.get("accepted", 0), drafts))
            if op.get("budget"):
                dropped["a step's token budget (the engine's is max_num_batched_tokens)"] = \
                    dropped.get("a step's token budget (the engine's is max_num_batched_tokens)", 0) + 1
            ops.append(step)
        elif kind == "finish":
            ops.append({"do": "abort", "id": op["id"]})
        elif kind == "reset":
            ops.append({"do": "reset"})
        elif kind == "evict" and setup.kv_connector == OWN_CONNECTOR:
            pass  # carried by the request's arrival: its load fails from that block
        else:
            why = {"preempt": "preempt (not sent as an operation: the engine preempts only under pool pressure, which the pressure trials make)",
                   "evict": "evict (the engine evicts only on a failed connector load; this setup has no "
                            "connector that fails one)"}[kind]
            dropped[why] = dropped.get(why, 0) + 1
    notes = [f"{n} x {why}" for why, n in sorted(dropped.items())]
    # A step after the last operation, so the state after it is read through the scheduler too.
    return EngineProgram(setup, tuple(ops) + ({"do": "step"},)), notes


def preempt_points(program: Program) -> list[tuple[int, str]]:
    """Each preemption of the program: where it falls in the translation (how
    many engine operations ``translate`` gives before it) and the request."""
    points: list[tuple[int, str]] = []
    before = 0
    for op in program.ops:
        if op["do"] == "preempt":
            points.append((before, op["id"]))
        elif op["do"] in ("arrive", "schedule", "finish", "reset"):
            before += 1
    return points


def pressure_pool(derived: dict[str, Any]) -> int:
    """A pool under pressure: the blocks one request of the model length
    takes in every KV-cache group vLLM built, at the block sizes it chose
    (about the least the engine accepts: it refuses a pool that cannot hold
    one such request)."""
    return sum(-(-MAX_MODEL_LEN // int(g["block_size"])) for g in derived["groups"])


def pressure_trial(program: Program, translated: EngineProgram, filler: int,
                   steps: int) -> tuple[EngineProgram, list[dict[str, Any]], str] | None:
    """The program's first preemption made by pool pressure (None: it has
    none).  vLLM's scheduler preempts the last running request when one it
    schedules needs a block the pool does not have; so a request of
    ``filler`` distinct tokens arrives first and runs to the model length (it
    holds blocks and grows), the preempted request runs to the model length
    too, and the translated operations up to the program's preemption are
    followed by ``steps`` engine steps.  Returns the trial program, the
    operations the program has after its preemption, and the request.  The
    reproduction drives the trial, cuts it at the step whose ``schedule()``
    preempted the request, and goes on with ``after_preemption``."""
    points = preempt_points(program)
    if not points:
        return None
    at, victim = points[0]
    ops = [dict(op) for op in translated.ops]
    for op in ops[:at]:
        if op["do"] == "arrive" and op["id"] == victim:
            op["max_tokens"] = max(op["max_tokens"], MAX_MODEL_LEN - len(op["tokens"]))
    pressure = {"do": "arrive", "id": PRESSURE_ID, "tokens": [90_000 + i for i in range(filler)],
                "max_tokens": MAX_MODEL_LEN - filler}
    trial = [pressure] + ops[:at] + [{"do": "step"}] * steps
    return translated.with_ops(trial), ops[at:], victim


def after_preemption(trial: EngineProgram, preempted_at: int, rest: list[dict[str, Any]]) -> EngineProgram:
    """The trial up to the operation (its index) whose step preempted the
    request, the pressure request aborted (the preempted one may resume, as
    the program's did), then the program's operations after its preemption."""
    return trial.with_ops(list(trial.ops[:preempted_at + 1]) + [{"do": "abort", "id": PRESSURE_ID}] + list(rest))


def reproduction_reach(record: dict[str, Any]):
    """The ``Reach`` of a stateful finding from its engine reproduction
    (``inputs["engine_reproduction"]``): reachable through vLLM's scheduler
    (not hardening), hand-built only after the stated search (hardening), or
    unknown when the search did not run to its end (not called hardening for
    want of a search)."""
    from .finding import Reach

    return Reach(record["summary"], hardening=record.get("status") == "not reproduced")
