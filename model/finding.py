"""One finding model for every source (a proof, a fuzz run): plain values.

A finding says what was compared, the verdict, a category, the minimal inputs
in vLLM's vocabulary, one row per KV-cache group (expected vs observed, in
tokens and in blocks, with both derivations), what the proofs know about it
(``Explanation``) and which pair of the three legs -- the spec evaluated by
Z3, the executable oracle, the subject -- disagrees (``Ledger``).  Producers
live in ``proofs`` and ``kvspec.findings.assemble``; renderers only read these values.
The JSON form (``to_dict``/``from_dict``) is versioned by ``FINDING_SCHEMA``.
"""

from __future__ import annotations

import enum
from typing import Any

import attrs

from .about import SCHEMAS

__all__ = [
    "FINDING_SCHEMA",
    "hand_built_impact",
    "VLLM_TESTS_NOT_ASKED",
    "Category",
    "Blame",
    "Ledger",
    "blame_of",
    "Derivation",
    "GroupRow",
    "TheoremRef",
    "Explanation",
    "Reach",
    "Impact",
    "Finding",
]

FINDING_SCHEMA = SCHEMAS["finding"]
PREVIOUS_SCHEMA = "kvspec.finding/1"  # still read: findings are kept as CI artifacts

# Why vLLM's own tests were not asked about a finding, by the key a finding
# records (``vllm_tests = {"asked": False, "why_not": KEY, ...}``): the
# producer (kvspec.findings.vllm_suite) and the renderers read one text.
VLLM_TESTS_NOT_ASKED = {
    "release": "a published release's own tests are the baseline they would be compared with: they passed in "
               "vLLM's CI before it shipped, so on the release they pass by definition and cannot tell this bug "
               "apart (they are asked about a mutant, against its unmutated release, and about a source tree)",
    "current": "the vLLM of the current environment has no release tests kvspec knows to run",
    "no_tests": "the release's test files were not available (no source distribution: offline?)",
}


class Category(str, enum.Enum):
    # The subject registers fewer tokens than the spec: prefix-cache hits lost.
    UNDER_REGISTRATION = "under_registration"
    # The subject registers more than the spec: tokens that are not finalized
    # or that no lookup can match (a safety problem, not a performance one).
    OVER_REGISTRATION = "over_registration"
    # Same token bounds, different registered full blocks.
    BLOCK_MISMATCH = "block_mismatch"
    # The subject chose another regime (partial hits, EAGLE flags) than the model derives.
    REGIME_MISMATCH = "regime_mismatch"
    # The subject raised while driving a configuration both sides accept.
    SUBJECT_CRASH = "subject_crash"
    # The subject rejects a configuration the model accepts.
    PRECONDITION = "precondition"
    # The subject called cache_blocks a different number of times than steps taken.
    CALL_MISMATCH = "call_mismatch"
    # The spec violates one of its own theorems (safety, no-loss, monotonicity).
    PROPERTY_VIOLATION = "property_violation"
    # A later request's hit breaks the lookup contract: not a landing point,
    # past what it shares, or needing blocks the writer never registered.
    LOOKUP_CONTRACT = "lookup_contract"
    # A later request's hit differs from the spec's (registration agreed).
    HIT_MISMATCH = "hit_mismatch"
    # The manager's state breaks one of its invariants (model.state), one
    # category per invariant: found by the stateful differential.
    STATE_FREE_LIST = "state_free_list"
    STATE_FREE_BLOCKS = "state_free_blocks"
    STATE_REF_COUNT = "state_ref_count"
    STATE_HASH_MAP = "state_hash_map"
    STATE_ONE_GROUP = "state_one_group"
    STATE_TABLE_APPEND_ONLY = "state_table_append_only"
    STATE_TABLE_COVERAGE = "state_table_coverage"
    STATE_FORGET = "state_forget"
    STATE_LOOKUP_PURITY = "state_lookup_purity"
    STATE_HIT_BOUNDS = "state_hit_bounds"
    STATE_HIT_GROUPS = "state_hit_groups"
    STATE_HIT_LENGTH = "state_hit_length"
    STATE_RESET = "state_reset"
    STATE_LEAK = "state_leak"
    STATE_ZEROING = "state_zeroing"
    STATE_ZEROING_MISSED = "state_zeroing_missed"
    STATE_BLOCK_ESTIMATE = "state_block_estimate"
    STATE_EVICTED_FINDABLE = "state_evicted_findable"
    STATE_RETENTION_HIT = "state_retention_hit"
    STATE_FREE_ORDER = "state_free_order"
    STATE_WINDOW = "state_window"
    STATE_MAMBA_STATE = "state_mamba_state"

    @property
    def is_state(self) -> bool:
        """Found by the stateful differential (a broken ``model.state`` invariant)."""
        return self.value.startswith("state_")

    @property
    def meaning(self) -> str:
        return _MEANINGS[self]

    @property
    def title(self) -> str:
        return self.value.replace("_", "-")


_MEANINGS = {
    Category.UNDER_REGISTRATION: "hit-rate loss: fewer tokens registered than the spec allows",
    Category.OVER_REGISTRATION: "safety: tokens registered that are not finalized or cannot be matched",
    Category.BLOCK_MISMATCH: "the registered full blocks differ though the bounds agree",
    Category.REGIME_MISMATCH: "vLLM chose another regime than the model derives from the configuration",
    Category.SUBJECT_CRASH: "vLLM raised on a configuration both sides accept",
    Category.PRECONDITION: "vLLM rejects a configuration the model accepts",
    Category.CALL_MISMATCH: "cache_blocks was not called once per allocate_slots step",
    Category.PROPERTY_VIOLATION: "the spec violates one of its own theorems",
    Category.LOOKUP_CONTRACT: "a later request's hit is not one the registered blocks and the lookup rules allow",
    Category.HIT_MISMATCH: "a later request's hit differs from the spec's: lost hits if shorter, reuse past "
                           "what is shared or registered if longer",
    Category.STATE_FREE_LIST: "the free-block queue and its counter disagree, or hold a block twice",
    Category.STATE_FREE_BLOCKS: "a block is free while referenced, or unreferenced and not free (leaked)",
    Category.STATE_REF_COUNT: "a block's reference count differs from the table slots holding it",
    Category.STATE_HASH_MAP: "the prefix-cache hash map and the blocks' own keys disagree",
    Category.STATE_ONE_GROUP: "one block is held by two KV-cache groups at once",
    Category.STATE_TABLE_APPEND_ONLY: "a running request's block table changed a slot or shrank",
    Category.STATE_TABLE_COVERAGE: "a running request's table does not cover its computed tokens",
    Category.STATE_FORGET: "a freed or preempted request is still tracked by a group",
    Category.STATE_LOOKUP_PURITY: "a lookup changed the pool",
    Category.STATE_HIT_BOUNDS: "a hit past the request's last token or off its landing points",
    Category.STATE_HIT_GROUPS: "the groups of one lookup disagree on the hit, or a hit block is not cached",
    Category.STATE_HIT_LENGTH: "a one-group model's hit is not the leading run of its blocks the cache holds",
    Category.STATE_RESET: "reset_prefix_cache succeeded with blocks held, failed without, or left keys",
    Category.STATE_LEAK: "blocks are missing from the free queue when no request holds any",
    Category.STATE_BLOCK_ESTIMATE: "an allocation took more free blocks than the groups' estimates the scheduler checked",
    Category.STATE_RETENTION_HIT: "a resend or sibling request hit less than what retention kept for it (hits lost)",
    Category.STATE_FREE_ORDER: "the free queue's order breaks vLLM's eviction contract (least recently used "
                               "first, a freed request's blocks tail first)",
    Category.STATE_WINDOW: "a sliding-window group no longer holds a block inside the window the request's next "
                           "step reads",
    Category.STATE_MAMBA_STATE: "a Mamba group no longer holds the block with the request's running state, which "
                                "its next step continues from",
    Category.STATE_ZEROING: "a block handed out for zeroing is not one the operation placed",
    Category.STATE_ZEROING_MISSED: "a fresh attention block on a layout vLLM zeroes was not handed out for zeroing",
    Category.STATE_EVICTED_FINDABLE: "a block evict_blocks evicted (a failed KV load) is still findable by a lookup: "
                                     "it owns a key, or the hash map names it",
}


class Blame(str, enum.Enum):
    # Z3 and the oracle agree on the spec's values; the subject differs.
    IMPLEMENTATION_BUG = "implementation bug"
    # Z3 (the spec as terms) and the subject agree; the executable oracle differs.
    ORACLE_BUG = "oracle bug"
    # The spec itself is at fault: it violates one of its own theorems, or its
    # preconditions admit a configuration vLLM rightly rejects.
    SPEC_BUG = "spec bug"
    # A leg is missing or all three differ: a person has to look.
    UNDETERMINED = "undetermined"
    AGREE = "no disagreement"


def blame_of(z3_spec: Any, oracle: Any, subject: Any) -> Blame:
    """Which pair disagrees, from the three legs' values (None: leg not run)."""
    if z3_spec is None or oracle is None or subject is None:
        return Blame.UNDETERMINED
    if z3_spec == oracle == subject:
        return Blame.AGREE
    if z3_spec == oracle:
        return Blame.IMPLEMENTATION_BUG
    if z3_spec == subject:
        return Blame.ORACLE_BUG
    return Blame.UNDETERMINED


def _tuple(value: Any) -> Any:
    return None if value is None else tuple(value)


@attrs.frozen
class Ledger:
    z3_spec: tuple[Any, ...] | None = attrs.field(converter=_tuple)
    oracle: tuple[Any, ...] | None = attrs.field(converter=_tuple)
    subject: tuple[Any, ...] | None = attrs.field(converter=_tuple)
    subject_label: str
    blame: Blame = attrs.field(converter=Blame)
    note: str = ""
    # The fourth leg: the subject's real code checked symbolically (status,
    # target method, detail, counterexample), when it was run.
    real_code: dict[str, Any] | None = None

    @property
    def real_code_reading(self) -> str | None:
        """What the symbolic leg adds to the verdict."""
        rc = self.real_code
        if not rc:
            return None
        status, target = rc.get("status"), rc.get("target") or "the registration method"
        if status == "REFUTED":
            return f"{target} itself is wrong (symbolic counterexample, replayed)"
        if status == "VERIFIED" and self.blame is Blame.IMPLEMENTATION_BUG:
            return (f"{target} is right for every input: the difference comes from the code "
                    "around it (the constructor's derived attributes, the group managers)")
        if status == "VERIFIED":
            return f"{target} is right for every input"
        return f"symbolic leg {status}: {rc.get('detail', '')}"


@attrs.frozen
class Derivation:
    """One side's derivation of one group's bound (None: not known)."""

    rule: str  # "spec", a model variant's name, ...
    cached: int | None = None
    finalized: int | None = None
    aligned_finalized: int | None = None
    eagle_bound: int | None = None
    eagle_branch: bool | None = None
    bound: int | None = None


@attrs.frozen
class GroupRow:
    group: int
    kind: str
    block_size: int
    eagle: bool
    expected_tokens: int | None
    observed_tokens: int | None
    expected_blocks: int | None
    observed_blocks: int | None
    spec: Derivation | None = None
    subject: Derivation | None = None  # the model variant the subject behaves like

    @property
    def differs(self) -> bool:
        return (self.expected_tokens, self.expected_blocks) != (self.observed_tokens, self.observed_blocks)

    @property
    def token_gap(self) -> int | None:
        """Spec minus subject: positive means lost registrations."""
        if self.expected_tokens is None or self.observed_tokens is None:
            return None
        return self.expected_tokens - self.observed_tokens


@attrs.frozen
class TheoremRef:
    name: str
    statement: str
    status: str  # PROVED / REFUTED / UNKNOWN, as this run found it
    as_expected: bool
    seconds: float


@attrs.frozen
class Explanation:
    """What the solver knows about a finding."""

    # The model variant the subject matches at every call (None: none does).
    diagnosis: str | None
    diagnosis_summary: str
    # "regression" (the subject loses what the spec keeps), "intended" (a drop
    # the spec itself makes, e.g. the EAGLE lookahead), "safety", "other".
    nature: str
    loss_formula: str | None = None
    loss_predicted: int | None = None  # the proved formula at this finding's inputs
    loss_observed: int | None = None  # spec minus subject at this call
    worst_case: str | None = None
    # The bounds the worst case was proved over ("S <= 64"), whether they cover
    # this finding, and (when not) what the closed form gives at it instead.
    # Findings stored before these were recorded leave them None.
    worst_case_bounds: str | None = None
    worst_case_covers: bool | None = None
    worst_case_here: str | None = None
    reachability: str | None = None
    reachable_here: bool | None = None  # the condition evaluated at this finding's inputs
    theorems: tuple[TheoremRef, ...] = attrs.field(default=(), converter=tuple)
    knobs: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    intended_drop: tuple[str, ...] = attrs.field(default=(), converter=tuple)


@attrs.frozen
class Reach:
    """Which known deployments reach a finding, and how badly.

    ``profiles``: one entry per deployment profile and flag combination under
    which the finding's rule differs from the spec on that release, each with
    how its configuration was derived (which steps called the release's own
    code, which were modelled) and its impact (tokens lost at a request's end,
    hit-rate points where measured).  Empty: no known deployment reaches it.
    ``summary`` is one plain sentence a reviewer decides on; ``hardening`` is
    True when no deployment reaches it or its effect is only on speculative
    acceptance (then it is reported as hardening, not as a regression)."""

    summary: str
    profiles: tuple[dict[str, Any], ...] = attrs.field(default=(), converter=tuple)
    worst: dict[str, Any] | None = None
    hardening: bool = False


@attrs.frozen
class Impact:
    """What a user sees of a finding, measured on the subject (``kvspec.findings.impact``).

    ``kind``: "crash" (vLLM raised: the engine process dies), "hit_lost"
    (a resend hit fewer tokens than ``expected``: the difference is
    recomputed), "hit_gained" (a mutant's lookup hit more than the unmutated
    release's: KV the release recomputes is reused), "blocks_leaked" (blocks
    not free once every request finished), "no_loss" (measured, nothing a
    user sees) or "not_measured".
    ``measured`` and ``expected`` are in ``unit`` (tokens, blocks, steps);
    ``how_measured`` says on what, at which configuration and against what
    the expectation is; ``summary`` is the report's impact sentence;
    ``lookups`` holds one row per request's admitting lookup (the program's own
    requests and the resends after it: request, what it resends, prompt
    length, hit, KV-connector tokens, kvspec's model's owed hit or None
    where it predicts none, the reference's hit)."""

    kind: str
    summary: str
    measured: int | None = None
    expected: int | None = None
    unit: str | None = None
    how_measured: str = ""
    lookups: tuple[dict[str, Any], ...] = attrs.field(default=(), converter=tuple)
    reference: str | None = None  # the subject the expectation was measured on (an unmutated release)


_NOT_MEASURED_HAND_BUILT = "not measured: hand-built configuration (no engine configuration reproduces it yet)"


def hand_built_impact(category: Category) -> Impact:
    return Impact("not_measured", f"Not measured: hand-built configuration (no engine configuration reproduces it "
                                  f"yet); for this finding's own program only, vLLM's KV-cache manager, driven as its "
                                  f"scheduler drives it, ends in a state its own rules forbid: {category.meaning}.",
                  how_measured=_NOT_MEASURED_HAND_BUILT)



@attrs.frozen
class Finding:
    source: str  # "fuzz" or "prove"
    verdict: str  # one line, first in every report
    category: Category = attrs.field(converter=Category)
    compared: dict[str, Any]  # spec rule, subject (kind, label, version, path, git commit), versions
    inputs: dict[str, Any]  # the minimal inputs in vLLM's vocabulary
    call: int | None = None  # the cache_blocks call that differs
    n: int | None = None  # num_computed_tokens at that call
    hashed_tokens: int | None = None
    groups: tuple[GroupRow, ...] = attrs.field(default=(), converter=tuple)
    explanation: Explanation | None = None
    reach: Reach | None = None  # which real deployments reach it (None: not assessed)
    # What a user sees, measured on the subject (None: not measured, or stored before kvspec measured it).
    impact: Impact | None = None
    ledger: Ledger | None = None
    detail: str = ""
    traceback: str | None = None
    replay: str | None = None
    regression_test: dict[str, Any] | None = None  # code, file name, verification, whether proposed
    # The release's own tests run on the subject first (kvspec.findings.vllm_suite):
    # files, each side's outcome, the tests that catch the finding; or why they were
    # not asked (VLLM_TESTS_NOT_ASKED); None: a finding stored before kvspec said.
    vllm_tests: dict[str, Any] | None = None
    sweep: dict[str, Any] | None = None  # registered vs n over a range (for the plot)
    observations: dict[str, Any] | None = None  # the subject's raw record (or its traceback)
    artifacts: dict[str, str] = attrs.field(factory=dict)  # stored files: finding, plot, test
    run: dict[str, Any] = attrs.field(factory=dict)  # seed, examples, cases, seconds

    def to_dict(self) -> dict[str, Any]:
        return {"schema": FINDING_SCHEMA, **attrs.asdict(self, value_serializer=_serialize)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Finding":
        schema = data.get("schema")
        if schema not in (FINDING_SCHEMA, PREVIOUS_SCHEMA):
            raise ValueError(f"not a {FINDING_SCHEMA} finding (schema {schema!r})")
        d = {k: v for k, v in data.items() if k != "schema"}
        if schema == PREVIOUS_SCHEMA and isinstance(d.get("ledger"), dict) and "verdict" in d["ledger"]:
            # kvspec.finding/1 called the ledger's blame its "verdict".
            d["ledger"] = {("blame" if k == "verdict" else k): v for k, v in d["ledger"].items()}
        d["groups"] = tuple(_group_row(g) for g in d.get("groups", ()))
        if d.get("explanation") is not None:
            e = dict(d["explanation"])
            e["theorems"] = tuple(TheoremRef(**t) for t in e.get("theorems", ()))
            d["explanation"] = Explanation(**e)
        if d.get("ledger") is not None:
            d["ledger"] = Ledger(**d["ledger"])
        if d.get("reach") is not None:
            d["reach"] = Reach(**d["reach"])
        if d.get("impact") is not None:
            d["impact"] = Impact(**d["impact"])
        return cls(**d)

    @property
    def differing_groups(self) -> tuple[GroupRow, ...]:
        return tuple(g for g in self.groups if g.differs)

    def subject_capabilities(self):
        """What the subject could do, as recorded (the newest era's when the
        finding does not say: proof findings have no subject)."""
        from .capabilities import Capabilities

        return Capabilities.from_dict(self.compared.get("capabilities") or {})


def _group_row(data: dict[str, Any]) -> GroupRow:
    d = dict(data)
    for side in ("spec", "subject"):
        if d.get(side) is not None:
            d[side] = Derivation(**d[side])
    return GroupRow(**d)


def _serialize(instance: Any, field: Any, value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple):
        return list(value)
    return value
