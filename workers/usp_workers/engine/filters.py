"""Payload filters: which events of its types a subscription takes, judged on the event's JSON.

A filter is a small JSON tree, checked and compiled when it is saved and evaluated when an event
is emitted (an event it refuses gets no delivery row)::

    {"all": [{"path": "data.service_id", "eq": "svc_haircut_001"},
             {"any": [{"path": "data.buyer.email", "exists": true},
                      {"path": "data.price.amount", "gte": 50}]}]}

Leaves name a dotted ``path`` into the event envelope and one operator: ``eq``, ``ne``, ``in``
(a list), ``exists`` (true or false), ``lt``, ``lte``, ``gt``, ``gte`` (numbers) or ``prefix`` (a
string). ``all`` / ``any`` combine, ``not`` negates. No regular expressions: every filter runs in
time linear in its size, and its size is bounded (:data:`LIMITS`), so none can be hostile.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

__all__ = ["LIMITS", "Filter", "FilterError", "Judgement", "compile_filter", "parse_filter"]

COMPARISONS: Final = ("lt", "lte", "gt", "gte")
OPERATORS: Final = ("eq", "ne", "in", "exists", "prefix", *COMPARISONS)
COMBINATORS: Final = ("all", "any", "not")


@dataclass(frozen=True, slots=True)
class Limits:
    depth: int = 6  #: nested all/any/not
    nodes: int = 64  #: leaves and combinators, in all
    text: int = 8192  #: the filter's JSON, in characters
    segments: int = 12  #: a path's dotted parts
    choices: int = 100  #: an ``in`` list's values
    value: int = 1024  #: a string operand's characters


LIMITS: Final = Limits()
_SEGMENT = re.compile(r"[A-Za-z0-9_\-]{1,64}")
_MISSING: Final = object()


class FilterError(ValueError):
    """A filter that cannot be saved; ``where`` is the JSON path of the part at fault."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"filter {where}: {problem}")
        self.where = where
        self.problem = problem


@dataclass(frozen=True, slots=True)
class Judgement:
    """Whether an event passed, and if not, the first leaf that decided it, in words."""

    passed: bool
    why: str = ""


#: A compiled node: the event in, whether it passed and why not.
Node = Callable[[Mapping[str, Any]], Judgement]


@dataclass(frozen=True, slots=True)
class Filter:
    """A checked filter: ``source`` as saved (canonical JSON), ``judge`` evaluates it."""

    source: str
    judge: Node

    def matches(self, event: Mapping[str, Any]) -> bool:
        return self.judge(event).passed


def parse_filter(text: str | None) -> Filter | None:
    """A filter from its saved JSON (``None`` or empty: no filter)."""
    if not text:
        return None
    return compile_filter(json.loads(text))


def compile_filter(tree: Any) -> Filter:
    """Check ``tree`` and compile it; :class:`FilterError` names the first part at fault. The
    shape is checked first, so a tree too deep or too big is refused before it is serialised."""
    judge = _node(tree, "$", 0, [0])
    try:
        source = json.dumps(tree, separators=(",", ":"), sort_keys=True, allow_nan=False)
    except ValueError:
        raise FilterError("$", "holds a number JSON cannot carry (NaN or infinity)") from None
    if len(source) > LIMITS.text:
        raise FilterError("$", f"is {len(source)} characters of JSON, more than {LIMITS.text}")
    return Filter(source, judge)


def _node(tree: Any, where: str, depth: int, count: list[int]) -> Node:
    count[0] += 1
    if count[0] > LIMITS.nodes:
        raise FilterError(where, f"the filter has more than {LIMITS.nodes} parts")
    if depth > LIMITS.depth:
        raise FilterError(where, f"nests deeper than {LIMITS.depth} levels")
    if not isinstance(tree, dict):
        raise FilterError(where, "must be an object: a combinator (all, any, not) or a leaf with a path")
    combinator = [key for key in tree if key in COMBINATORS]
    if combinator:
        if len(tree) != 1:
            raise FilterError(where, f"{combinator[0]!r} stands alone in its object")
        return _combinator(combinator[0], tree[combinator[0]], f"{where}.{combinator[0]}", depth, count)
    return _leaf(tree, where)


def _combinator(name: str, operand: Any, where: str, depth: int, count: list[int]) -> Node:
    if name == "not":
        inner = _node(operand, where, depth + 1, count)

        def negated(event: Mapping[str, Any]) -> Judgement:
            judged = inner(event)
            return Judgement(True) if not judged.passed else Judgement(False, f"not ({_what(operand)})")

        return negated
    if not isinstance(operand, list) or not operand:
        raise FilterError(where, "must be a non-empty list of conditions")
    parts = [_node(part, f"{where}[{i}]", depth + 1, count) for i, part in enumerate(operand)]
    if name == "all":

        def every(event: Mapping[str, Any]) -> Judgement:
            for part in parts:
                judged = part(event)
                if not judged.passed:
                    return judged
            return Judgement(True)

        return every

    def some(event: Mapping[str, Any]) -> Judgement:
        reasons = []
        for part in parts:
            judged = part(event)
            if judged.passed:
                return judged
            reasons.append(judged.why)
        return Judgement(False, "none of: " + "; ".join(reasons))

    return some


def _leaf(tree: dict[str, Any], where: str) -> Node:
    path = tree.get("path")
    if not isinstance(path, str):
        raise FilterError(where, "a condition needs a path (a dotted name such as data.service_id)")
    segments = path.split(".")
    if len(segments) > LIMITS.segments or not all(_SEGMENT.fullmatch(s) for s in segments):
        raise FilterError(
            f"{where}.path",
            f"{path[:80]!r} is not a dotted path of at most {LIMITS.segments} names of letters, digits,"
            " _ and -",
        )
    operators = [key for key in tree if key != "path"]
    if len(operators) != 1 or operators[0] not in OPERATORS:
        named = ", ".join(repr(key) for key in operators) or "none"
        raise FilterError(where, f"needs exactly one operator of {', '.join(OPERATORS)} (has {named})")
    operator = operators[0]
    operand = tree[operator]
    _check_operand(operator, operand, f"{where}.{operator}")
    test = _test(operator, operand)
    shown = f"{path} {operator} {json.dumps(operand)[:80]}"

    def leaf(event: Mapping[str, Any]) -> Judgement:
        value = _lookup(event, segments)
        if test(value):
            return Judgement(True)
        found = "absent" if value is _MISSING else json.dumps(value, default=str)[:80]
        return Judgement(False, f"{shown} (found {found})")

    return leaf


def _check_operand(operator: str, operand: Any, where: str) -> None:
    if operator == "exists":
        if not isinstance(operand, bool):
            raise FilterError(where, "must be true or false")
    elif operator in COMPARISONS:
        if isinstance(operand, bool) or not isinstance(operand, int | float) or not math.isfinite(operand):
            raise FilterError(where, "must be a finite number")
    elif operator == "prefix":
        if not isinstance(operand, str) or not operand:
            raise FilterError(where, "must be a non-empty string")
        _check_scalar(operand, where)
    elif operator == "in":
        if not isinstance(operand, list) or not operand or len(operand) > LIMITS.choices:
            raise FilterError(where, f"must be a list of 1 to {LIMITS.choices} values")
        for i, choice in enumerate(operand):
            _check_scalar(choice, f"{where}[{i}]")
    else:
        _check_scalar(operand, where)


def _check_scalar(value: Any, where: str) -> None:
    if isinstance(value, str):
        if len(value) > LIMITS.value:
            raise FilterError(where, f"is longer than {LIMITS.value} characters")
    elif not (value is None or isinstance(value, bool | int | float)):
        raise FilterError(where, "must be a string, number, boolean or null")


def _test(operator: str, operand: Any) -> Callable[[Any], bool]:
    match operator:
        case "eq":
            return lambda value: value is not _MISSING and _same(value, operand)
        case "ne":
            return lambda value: value is _MISSING or not _same(value, operand)
        case "in":
            return lambda value: value is not _MISSING and any(_same(value, choice) for choice in operand)
        case "exists":
            return lambda value: (value is not _MISSING and value is not None) == operand
        case "prefix":
            return lambda value: isinstance(value, str) and value.startswith(operand)
        case "lt":
            return lambda value: _number(value) and value < operand
        case "lte":
            return lambda value: _number(value) and value <= operand
        case "gt":
            return lambda value: _number(value) and value > operand
        case _:
            return lambda value: _number(value) and value >= operand


def _same(value: Any, operand: Any) -> bool:
    """JSON equality: ``1 == 1.0``, but ``true`` is not ``1``."""
    if isinstance(value, bool) or isinstance(operand, bool):
        return value is operand
    return bool(value == operand)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _lookup(event: Mapping[str, Any], segments: list[str]) -> Any:
    value: Any = event
    for segment in segments:
        if isinstance(value, Mapping):
            value = value.get(segment, _MISSING)
        elif isinstance(value, list) and segment.isdigit() and int(segment) < len(value):
            value = value[int(segment)]
        else:
            return _MISSING
        if value is _MISSING:
            return _MISSING
    return value


def _what(tree: Any) -> str:
    return json.dumps(tree, separators=(",", ":"))[:120]
