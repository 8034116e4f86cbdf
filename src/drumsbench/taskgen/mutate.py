"""Procedural bugs in a real project's source, made without a language model.

Two families, as the field makes task instances from real repositories:

- **bug injection** in the spirit of SWE-smith's procedural modifiers: one small edit that keeps the
  file valid Python — a comparison flipped (``<`` to ``<=``, ``==`` to ``!=``, ``in`` to ``not in``), an
  integer off by one, ``and`` swapped with ``or``, a guard removed (an ``if`` whose body only returns,
  raises, breaks or continues), a wrong default (``True``/``False`` swapped, an integer default off
  by one), two positional arguments of a call swapped;
- **remove an implementation** in the spirit of SWE-Flow: a function's body (after its docstring)
  replaced by ``raise NotImplementedError``.

Contract: ``candidates(rel, source)`` lists every mutation of one file as a ``Mutation`` — an exact
byte edit (start, end, replacement) of the file, so the rest of the file stays byte for byte (no
reformatting); each applies (``apply``) to the text it was found in, parses, and differs from it.
The list is ordered by position then operator and is the same for the same bytes (the generator's
runs are byte-identical).
"""

from __future__ import annotations

import ast
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass

FLIP = {"<": "<=", "<=": "<", ">": ">=", ">=": ">", "==": "!=", "!=": "==", "is": "is not", "is not": "is",
        "in": "not in", "not in": "in"}
OPERATORS = ("flip_comparison", "off_by_one", "swap_bool_op", "drop_guard", "wrong_default", "swap_arguments",
             "remove_implementation")


@dataclass(frozen=True)
class Mutation:
    """One edit of file ``rel``: bytes ``start:end`` replaced by ``new``; ``operator`` names the kind,
    ``where`` the function (or ``<module>``) and line, ``what`` the edit in words."""

    rel: str
    operator: str
    start: int
    end: int
    new: bytes
    where: str
    what: str

    def apply(self, source: bytes) -> bytes:
        return source[:self.start] + self.new + source[self.end:]

    @property
    def key(self) -> str:
        """A short stable name: the digest of the file, edit and operator."""
        raw = f"{self.rel}:{self.start}:{self.end}:{self.operator}".encode() + b"\0" + self.new
        return hashlib.sha256(raw).hexdigest()[:8]


class _Lines:
    """Byte offsets of (line, column) as ``ast`` gives them (columns are UTF-8 byte offsets)."""

    def __init__(self, source: bytes) -> None:
        self.starts = [0]
        for i, b in enumerate(source):
            if b == 0x0A:
                self.starts.append(i + 1)

    def at(self, line: int, col: int) -> int:
        return self.starts[line - 1] + col

    def span(self, node: ast.expr | ast.stmt) -> tuple[int, int]:
        assert node.end_lineno is not None and node.end_col_offset is not None
        return self.at(node.lineno, node.col_offset), self.at(node.end_lineno, node.end_col_offset)


def _functions(tree: ast.AST) -> Iterator[tuple[str, ast.AST]]:
    """Every node with the name of the function (or ``<module>``) it is in."""
    def walk(node: ast.AST, name: str) -> Iterator[tuple[str, ast.AST]]:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else name
            yield inner, child
            yield from walk(child, inner)
    yield from walk(tree, "<module>")


def _between(source: bytes, start: int, end: int) -> tuple[int, int, str] | None:
    """The one operator word or symbol between two operands (parentheses and spaces around it), as
    (start, end, text), or None when there is more (a comment, a line break)."""
    gap = source[start:end]
    text = gap.decode(errors="replace")
    stripped = text.strip().strip("()").strip()
    if "#" in text or "\\" in text or not stripped:
        return None
    offset = start + len(gap.decode(errors="replace")[:text.index(stripped)].encode())
    return offset, offset + len(stripped.encode()), " ".join(stripped.split())


def candidates(rel: str, source: bytes) -> list[Mutation]:
    """Every mutation of file ``rel`` whose text is ``source`` (module contract)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    lines = _Lines(source)
    out: list[Mutation] = []

    def add(operator: str, start: int, end: int, new: bytes, func: str, node: ast.expr | ast.stmt, what: str) -> None:
        out.append(Mutation(rel, operator, start, end, new, f"{func} (line {node.lineno})", what))

    for func, node in _functions(tree):
        if isinstance(node, ast.Compare) and len(node.ops) == 1:
            _, left_end = lines.span(node.left)
            right_start, _ = lines.span(node.comparators[0])
            found = _between(source, left_end, right_start)
            if found and found[2] in FLIP:
                add("flip_comparison", found[0], found[1], FLIP[found[2]].encode(), func, node,
                    f"`{found[2]}` made `{FLIP[found[2]]}`")
        elif isinstance(node, ast.BoolOp) and len(node.values) == 2:
            _, left_end = lines.span(node.values[0])
            right_start, _ = lines.span(node.values[1])
            found = _between(source, left_end, right_start)
            other = {"and": "or", "or": "and"}
            if found and found[2] in other:
                add("swap_bool_op", found[0], found[1], other[found[2]].encode(), func, node,
                    f"`{found[2]}` made `{other[found[2]]}`")
        elif (isinstance(node, ast.Constant) and type(node.value) is int and 0 <= node.value <= 4
              and getattr(node, "end_lineno", None) == node.lineno):
            start, end = lines.span(node)
            if source[start:end].decode(errors="replace") == str(node.value):
                add("off_by_one", start, end, str(node.value + 1).encode(), func, node,
                    f"`{node.value}` made `{node.value + 1}`")
        elif isinstance(node, ast.If) and not node.orelse and len(node.body) == 1 and isinstance(
                node.body[0], (ast.Return, ast.Raise, ast.Break, ast.Continue)):
            start, end = lines.span(node)
            line_start = lines.starts[node.lineno - 1]
            if source[line_start:start].strip() == b"" and end <= len(source):
                indent = source[line_start:start]
                add("drop_guard", line_start, end, indent + b"pass", func, node,
                    f"the guard `if {ast.unparse(node.test)[:60]}` removed")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for default in [*node.args.defaults, *(d for d in node.args.kw_defaults if d is not None)]:
                if isinstance(default, ast.Constant) and (type(default.value) is bool or type(default.value) is int):
                    start, end = lines.span(default)
                    old = source[start:end].decode(errors="replace")
                    new = (str(not default.value) if type(default.value) is bool else str(default.value + 1))
                    if old == str(default.value):
                        add("wrong_default", start, end, new.encode(), node.name, default,
                            f"default `{old}` made `{new}`")
            body = node.body
            first = 1 if (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                          and isinstance(body[0].value.value, str)) else 0
            if len(body) > first and not any(isinstance(n, (ast.Yield, ast.YieldFrom)) for n in ast.walk(node)):
                start, _ = lines.span(body[first])
                _, end = lines.span(body[-1])
                line_start = lines.starts[body[first].lineno - 1]
                if source[line_start:start].strip() == b"":
                    add("remove_implementation", line_start, end,
                        source[line_start:start] + b"raise NotImplementedError", node.name, node,
                        f"the body of `{node.name}` removed")
        elif (isinstance(node, ast.Call) and len(node.args) == 2 and not node.keywords
              and not any(isinstance(a, ast.Starred) for a in node.args)):
            a0, a1 = (lines.span(a) for a in node.args)
            first_text, second_text = source[a0[0]:a0[1]], source[a1[0]:a1[1]]
            if first_text != second_text and b"\n" not in source[a0[0]:a1[1]]:
                add("swap_arguments", a0[0], a1[1], second_text + source[a0[1]:a1[0]] + first_text, func, node,
                    f"the arguments of `{ast.unparse(node.func)[:40]}` swapped")

    good = []
    for m in sorted(out, key=lambda m: (m.start, m.end, m.operator)):
        mutated = m.apply(source)
        if mutated == source:
            continue
        try:
            ast.parse(mutated)
        except SyntaxError:
            continue
        good.append(m)
    return good
