"""Source text with byte-accurate node spans, and structural matching helpers.

Mutation operators locate code with ``ast`` (never by global text search):
these helpers find classes, methods and expression shapes by structure and
rewrite exactly the intended span from the nodes' line/column offsets.
"""

from __future__ import annotations

import ast
import threading
import time
from typing import Iterator

import attrs

__all__ = ["parse", "Missing", "Edit", "Source", "walk", "exactly_one", "find_class", "find_method", "is_name",
           "is_attr", "is_const", "is_call", "is_method_call", "floor_text", "function_dumps"]


class Missing(Exception):
    """What was looked for and not found (exactly once)."""


# ---------------------------------------------------------------------------
# Source spans


@attrs.frozen
class Edit:
    start: int  # byte offsets into the UTF-8 encoded source
    end: int
    text: str


# CPython 3.11.7 (this machine's Python) keeps ast.parse's recursion count in
# state shared by threads: two parses at once can fail with "SystemError: AST
# constructor recursion depth mismatch" (seen in CI, a mutant's source parsed
# while vLLM's test helpers were).  Every parse kvspec does goes through here.
_PARSE_LOCK = threading.Lock()


def parse(text: str) -> ast.Module:
    """``ast.parse``, one thread at a time.  Code outside kvspec parses too
    (Python 3.11's traceback module does, for its carets), so the shared
    count can still be off when another thread parsed meanwhile: then the
    parse is tried again (it is pure; only the count was wrong)."""
    with _PARSE_LOCK:
        for attempt in range(5):
            try:
                return ast.parse(text)
            except SystemError as exc:
                if "recursion depth mismatch" not in str(exc) or attempt == 4:
                    raise
                time.sleep(0.01 * (attempt + 1))
    raise AssertionError("unreachable")


class Source:
    """A module's text with byte-accurate node spans (``col_offset`` counts
    UTF-8 bytes, so all slicing happens on the encoded source)."""

    def __init__(self, text: str):
        self.text = text
        self.data = text.encode("utf-8")
        starts = [0]
        for line in self.data.splitlines(keepends=True):
            starts.append(starts[-1] + len(line))
        self._line_starts = starts
        try:
            self.tree = parse(text)
        except SyntaxError as e:
            raise Missing(f"source does not parse ({e.msg}, line {e.lineno})") from None

    def span(self, node: ast.AST) -> tuple[int, int]:
        start = self._line_starts[node.lineno - 1] + node.col_offset
        end = self._line_starts[node.end_lineno - 1] + node.end_col_offset
        return start, end

    def segment(self, node: ast.AST) -> str:
        start, end = self.span(node)
        return self.data[start:end].decode("utf-8")

    def replace(self, node: ast.AST, text: str) -> Edit:
        start, end = self.span(node)
        return Edit(start, end, text)

    def apply(self, edits: list[Edit]) -> str:
        data = self.data
        ordered = sorted(edits, key=lambda e: e.start, reverse=True)
        for later, earlier in zip(ordered, ordered[1:]):
            if earlier.end > later.start:
                raise AssertionError("internal: overlapping edits")
        for e in ordered:
            data = data[: e.start] + e.text.encode("utf-8") + data[e.end :]
        return data.decode("utf-8")


# ---------------------------------------------------------------------------
# Structural matching


def walk(nodes: ast.AST | list[ast.AST]) -> Iterator[ast.AST]:
    for node in nodes if isinstance(nodes, list) else [nodes]:
        yield from ast.walk(node)


def exactly_one(found: list[ast.AST], what: str) -> ast.AST:
    if len(found) != 1:
        raise Missing(f"expected exactly one {what}, found {len(found)}")
    return found[0]


def find_class(tree: ast.Module, name: str) -> ast.ClassDef:
    return exactly_one(
        [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name],
        f"class {name}",
    )


def find_method(cls: ast.ClassDef, name: str) -> ast.FunctionDef | None:
    found = [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name]
    if len(found) > 1:
        raise Missing(f"expected at most one {cls.name}.{name}, found {len(found)}")
    return found[0] if found else None


def is_name(node: ast.AST, name: str | None = None) -> bool:
    return isinstance(node, ast.Name) and (name is None or node.id == name)


def is_attr(node: ast.AST, attr: str, owner: str | None = None) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == attr
        and (owner is None or is_name(node.value, owner))
    )


def is_const(node: ast.AST, value: int) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) is int and node.value == value


def is_call(node: ast.AST, func: str, nargs: int) -> bool:
    return (
        isinstance(node, ast.Call)
        and is_name(node.func, func)
        and len(node.args) == nargs
        and not node.keywords
    )


def is_method_call(node: ast.AST, owner: str, attr: str, nargs: int) -> bool:
    return (
        isinstance(node, ast.Call)
        and is_attr(node.func, attr, owner)
        and len(node.args) == nargs
        and not node.keywords
    )


def floor_text(x: str, self_name: str, unit: str) -> str:
    return f"({x} // {self_name}.{unit} * {self_name}.{unit})"



def function_dumps(tree: ast.Module) -> dict[str, str]:
    """ast.dump of every top-level function and class method, by qualified name."""
    out: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out[node.name] = ast.dump(node)
        elif isinstance(node, ast.ClassDef):
            rest = []
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    out[f"{node.name}.{item.name}"] = ast.dump(item)
                else:
                    rest.append(ast.dump(item))
            out[f"{node.name}.<body>"] = "\n".join(rest)
        else:
            out.setdefault("<module>", "")
            out["<module>"] += ast.dump(node) + "\n"
    return out
