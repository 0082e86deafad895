"""The specification's ideal prefix cache, for the hit-rate replay.

Every ``cache_blocks(n)`` call registers what ``model.spec`` says (or what a
variant's rule says, e.g. the #50062 re-floor), and a lookup gets the hit
``model.lookup`` allows on the registered prefix of every group.  It answers
the same scheduler actions as vLLM's own manager in a worker
(``subjects/drivers/hitrate.py`` replays a workload through either), counting
every registered block as reachable (a dense prefix per group), with no
eviction.
"""

from __future__ import annotations

from typing import Any

from kvspec.model.arith import INT
from kvspec.model.capabilities import ExpectedRegime
from kvspec.model.domain import CoordinatorConfig
from kvspec.model.lookup import dense_lookup_hit
from kvspec.model.replies import SessionAnswer, Started, Stepped
from kvspec.model.spec import RegistrationRule, evaluate_config, hashed_tokens, inputs_for_group, registration_bound

__all__ = ["SpecCache"]


class _Trie:
    """Block-content prefixes of one block size, interned: node ids stand for
    exact token prefixes (no hash collisions in the ideal)."""

    def __init__(self, block_size: int):
        self.block_size = block_size
        self._children: dict[tuple[int, tuple[int, ...]], int] = {}

    def path(self, tokens: list[int], blocks: int, create: bool) -> list[int]:
        """Node ids of the first ``blocks`` full blocks of ``tokens`` (stops at
        the first unknown one unless ``create``)."""
        node, out, B = 0, [], self.block_size
        for j in range(blocks):
            key = (node, tuple(tokens[j * B:(j + 1) * B]))
            child = self._children.get(key)
            if child is None:
                if not create:
                    break
                child = self._children[key] = len(self._children) + 1
            out.append(child)
            node = child
        return out


class SpecCache:
    """The specification's ideal cache: registration by ``rule`` (the spec by
    default), lookups by ``model.lookup`` over the registered prefixes."""

    def __init__(self, config: CoordinatorConfig, regime: ExpectedRegime,
                 rule: RegistrationRule = registration_bound, name: str = "spec ideal"):
        self.name = name
        self.config, self.regime, self.rule = config, regime, rule
        self.tries = {g.block_size: _Trie(g.block_size) for g in config.groups}
        self.registered: list[set[int]] = [set() for _ in config.groups]
        self.requests: dict[int, dict[str, Any]] = {}
        self.group_inputs = [
            inputs_for_group(config, i, 0, partial=regime.partial_hash_hits, eagle=regime.eagle[i],
                             lookahead=regime.num_prefill_lookahead)
            for i in range(len(config.groups))]

    def _hit(self, tokens: list[int]) -> int:
        H = self.config.hash_block_size
        hashed = hashed_tokens(INT, len(tokens), H)
        reaches = []
        for i, group in enumerate(self.config.groups):
            nodes = self.tries[group.block_size].path(tokens, hashed // group.block_size, create=False)
            dense = 0
            for node in nodes:
                if node not in self.registered[i]:
                    break
                dense += 1
            reaches.append(min(dense * group.block_size, hashed))
        return dense_lookup_hit(INT, self.group_inputs, reaches, len(tokens) - 1)

    def _step(self, state: dict[str, Any], step: dict[str, Any], outputs: list[int]) -> list[int]:
        tokens = state["tokens"]
        if step["kind"] == "prefill":
            new, drafts = step["tokens"], 0
        else:
            drafts = step["drafts"]
            new = len(tokens) + drafts - state["computed"]
        # What KVCacheManager hands cache_blocks: the computed tokens after
        # this step, never past the request's (non-speculative) tokens.
        n = min(state["computed"] + new, len(tokens))
        regs = evaluate_config(self.config, n, len(tokens), self.rule,
                               partial=self.regime.partial_hash_hits, eagle=self.regime.eagle,
                               lookahead=self.regime.num_prefill_lookahead)
        for i, (group, reg) in enumerate(zip(self.config.groups, regs)):
            self.registered[i].update(
                self.tries[group.block_size].path(tokens, reg.registered_full_blocks, create=True))
        state["computed"] += new - (drafts - step.get("accepted", 0) if step["kind"] == "decode" else 0)
        tokens.extend(outputs)
        return [r.tokens_to_cache for r in regs]

    def apply(self, actions: list[dict[str, Any]]) -> tuple[SessionAnswer, ...]:
        """Each action's answer, as vLLM's manager in a worker answers it."""
        answers: list[SessionAnswer] = []
        for action in actions:
            rid = action["id"]
            if action["do"] == "new_step":
                answers.append(None)
                continue
            if action["do"] == "start":
                tokens = list(action["tokens"])
                hit = self._hit(tokens) if self.config.enable_caching else 0
                self.requests[rid] = {"tokens": tokens, "computed": hit}
                answers.append(Started(hit, len(tokens)))
            elif action["do"] == "step":
                state = self.requests[rid]
                handed = self._step(state, action["step"], action["outputs"])
                answers.append(Stepped(state["computed"], tuple(handed)))
            else:
                self.requests.pop(rid)
                answers.append(None)
        return tuple(answers)
