"""AST mutation operators for the SWE-smith-style real-repository task builder.

Each operator yields (family, node, replacement source) for single-line expressions inside a
function; the builder splices the replacement into the file text at the node's exact
columns, so the rest of the file keeps its formatting and the oracle fix is one `edit`.
Families mirror the generated tasks: wrong_operator, off_by_one, swapped_args,
wrong_return, missing_branch (the latter removes a one-statement `if` block; lines).
"""
from __future__ import annotations

import ast
import copy
from typing import Iterator, Tuple

_CMP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
        ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot,
        ast.IsNot: ast.Is}
_BIN = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Add, ast.FloorDiv: ast.Mult,
        ast.Mod: ast.FloorDiv}
_BOOL = {ast.And: ast.Or, ast.Or: ast.And}


def _one_line(node) -> bool:
    return getattr(node, "lineno", None) is not None and node.lineno == node.end_lineno


def expression_mutations(func: ast.FunctionDef) -> Iterator[Tuple[str, ast.AST, str]]:
    for node in ast.walk(func):
        if not _one_line(node):
            continue
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _CMP:
            m = copy.deepcopy(node)
            m.ops = [_CMP[type(node.ops[0])]()]
            yield "wrong_operator", node, ast.unparse(m)
        elif isinstance(node, ast.BinOp) and type(node.op) in _BIN:
            m = copy.deepcopy(node)
            m.op = _BIN[type(node.op)]()
            yield "wrong_operator", node, ast.unparse(m)
        elif isinstance(node, ast.BoolOp) and type(node.op) in _BOOL:
            m = copy.deepcopy(node)
            m.op = _BOOL[type(node.op)]()
            yield "wrong_operator", node, ast.unparse(m)
        elif (isinstance(node, ast.Constant) and type(node.value) is int
              and node.value in (0, 1, 2, -1)):
            yield "off_by_one", node, repr(node.value + 1)
        elif (isinstance(node, ast.Call) and len(node.args) == 2 and not node.keywords
              and not any(isinstance(a, ast.Starred) for a in node.args)):
            m = copy.deepcopy(node)
            m.args = [m.args[1], m.args[0]]
            yield "swapped_args", node, ast.unparse(m)
        elif isinstance(node, ast.Return) and node.value is not None and not (
                isinstance(node.value, ast.Constant) and node.value.value is None):
            yield "wrong_return", node, "return None"


def branch_removals(func: ast.FunctionDef) -> Iterator[Tuple[int, int]]:
    """(first line, last line) of removable `if` blocks: no else, one simple statement,
    and not the only statement of their parent body (the file must still parse)."""
    for parent in ast.walk(func):
        for field in ("body", "orelse"):
            body = getattr(parent, field, None)
            if not isinstance(body, list) or len(body) < 2:
                continue
            for stmt in body:
                if (isinstance(stmt, ast.If) and not stmt.orelse and len(stmt.body) == 1
                        and isinstance(stmt.body[0], (ast.Return, ast.Raise, ast.Continue,
                                                      ast.Break, ast.Assign))):
                    yield stmt.lineno, stmt.end_lineno
