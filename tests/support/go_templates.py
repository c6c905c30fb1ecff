"""A test oracle: Prometheus' expansion of the part of Go's text/template the alerts' annotations
use (rules/alert_templates.py builds them), and the number formats of its template functions.

``render(text, labels, value, query)`` is what promtool expects an annotation to read (the promtool
suites), and what the checks that nothing renders empty or leaves a template behind read. Only the
forms the alerts use are known; anything else is an error, so a new form cannot slip by untested.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

Sample = tuple[Mapping[str, str], float]
Query = Callable[[str], Sequence[Sample]]


# ------------------------------------------------------------------ Go's number formats


def humanize(value: float) -> str:
    """Prometheus' ``humanize`` template function: ``1.5k``, ``25m``."""
    v = float(value)
    if v == 0 or math.isnan(v) or math.isinf(v):
        return go_g4(v)
    prefix = ""
    if abs(v) >= 1:
        for p in ("k", "M", "G", "T", "P", "E", "Z", "Y"):
            if abs(v) < 1000:
                break
            prefix = p
            v /= 1000
    else:
        for p in ("m", "u", "n", "p", "f", "a", "z", "y"):
            if abs(v) >= 1:
                break
            prefix = p
            v *= 1000
    return go_g4(v) + prefix


def humanize_percentage(value: float) -> str:
    """Prometheus' ``humanizePercentage``."""
    return go_g4(float(value) * 100) + "%"


def go_g4(v: float) -> str:
    """Go's ``fmt.Sprintf("%.4g", v)``."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return f"{v:.4g}"


# ---------------------------------------------------------------------------- functions


def humanize_duration(seconds: float) -> str:
    """Prometheus' ``humanizeDuration``: ``184ms``, ``1.5s``, ``2m 5s``."""
    v = float(seconds)
    if math.isnan(v) or math.isinf(v):
        return go_g4(v)
    if v == 0:
        return "0s"
    if abs(v) >= 1:
        sign = "-" if v < 0 else ""
        v = abs(v)
        days, rest = divmod(int(v), 86400)
        hours, rest = divmod(rest, 3600)
        minutes, whole = divmod(rest, 60)
        secs = whole + (v - int(v))
        if days:
            return f"{sign}{days}d {hours}h {minutes}m {int(secs)}s"
        if hours:
            return f"{sign}{hours}h {minutes}m {int(secs)}s"
        if minutes:
            return f"{sign}{minutes}m {int(secs)}s"
        return f"{sign}{go_g4(secs)}s"
    for factor, unit in ((1e3, "ms"), (1e6, "us"), (1e9, "ns"), (1e12, "ps")):
        if abs(v) * factor >= 1 or unit == "ps":
            return f"{go_g4(v * factor)}{unit}"
    raise AssertionError("unreachable")


def _go_quote(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _printf(fmt: str, *args: object) -> str:
    it = iter(args)

    def one(match: re.Match[str]) -> str:
        verb = match.group(1)
        if verb == "%":
            return "%"
        arg = next(it)
        return _go_quote(str(arg)) if verb == "q" else str(arg)

    return re.sub(r"%([qs%])", one, fmt)


def _truthy(v: object) -> bool:
    if isinstance(v, (list, tuple, str, dict)):
        return len(v) > 0
    if isinstance(v, bool):
        return v
    if isinstance(v, (int, float)):
        return v != 0
    return v is not None


# ------------------------------------------------------------------------------- parsing


@dataclass
class _Node:
    kind: str  # text | action | if | with | range | assign
    text: str = ""
    pipe: str = ""
    then: list[_Node] = field(default_factory=list)
    otherwise: list[_Node] = field(default_factory=list)


_ACTION = re.compile(r"\{\{\s*(.*?)\s*\}\}", re.S)


def _parse(text: str) -> list[_Node]:
    tokens: list[tuple[str, str]] = []
    pos = 0
    for m in _ACTION.finditer(text):
        if m.start() > pos:
            tokens.append(("text", text[pos : m.start()]))
        tokens.append(("action", m.group(1)))
        pos = m.end()
    if pos < len(text):
        tokens.append(("text", text[pos:]))
    nodes, _rest = _block(tokens, 0, top=True)
    return nodes


def _block(tokens: list[tuple[str, str]], i: int, top: bool = False) -> tuple[list[_Node], int]:
    """Nodes from ``i`` up to an ``else``/``end`` (not consumed) or the end of the template."""
    out: list[_Node] = []
    while i < len(tokens):
        kind, body = tokens[i]
        if kind == "text":
            out.append(_Node("text", text=body))
            i += 1
            continue
        word = body.split(None, 1)[0] if body else ""
        if word in ("else", "end"):
            if top:
                raise ValueError(f"unexpected {{{{ {body} }}}}")
            return out, i
        if word in ("if", "with", "range"):
            node, i = _control(tokens, i, word, body[len(word) :].strip())
            out.append(node)
            continue
        if re.match(r"^\$\w+\s*:=", body):
            name, pipe = body.split(":=", 1)
            out.append(_Node("assign", text=name.strip(), pipe=pipe.strip()))
        else:
            out.append(_Node("action", pipe=body))
        i += 1
    if not top:
        raise ValueError("a {{ if }} or {{ with }} without its {{ end }}")
    return out, i


def _control(tokens: list[tuple[str, str]], i: int, word: str, pipe: str) -> tuple[_Node, int]:
    node = _Node(word, pipe=pipe)
    node.then, i = _block(tokens, i + 1)
    body = tokens[i][1]
    if body == "else":
        node.otherwise, i = _block(tokens, i + 1)
        if tokens[i][1] != "end":
            raise ValueError("{{ else }} must be followed by {{ end }}")
        return node, i + 1
    if body.startswith("else if "):
        inner, i = _control(tokens, i, "if", body[len("else if ") :].strip())
        node.otherwise = [inner]
        return node, i  # the inner if consumed the shared {{ end }}
    return node, i + 1  # {{ end }}


# ---------------------------------------------------------------------------- evaluation


_WORD = re.compile(r'"(?:[^"\\]|\\.)*"|\((?:[^()"]|"(?:[^"\\]|\\.)*")*\)|[^\s]+')


class _Scope:
    def __init__(self, labels: Mapping[str, str], value: float, query: Query | None):
        self.labels = labels
        self.value = value
        self.query = query
        self.vars: dict[str, object] = {}

    def operand(self, word: str, dot: object) -> object:
        if word.startswith("(") and word.endswith(")"):  # a parenthesised pipeline, e.g. (or $labels.x "")
            return self.pipe(word[1:-1], dot)
        if word.startswith('"'):
            return json.loads(word)
        if word == ".":
            return dot
        if word == "$value":
            return self.value
        if word.startswith("$labels."):
            return str(self.labels.get(word[len("$labels.") :], ""))
        if word in self.vars:
            return self.vars[word]
        if ".Labels." in word and word.split(".", 1)[0] in self.vars:  # $c.Labels.x of a query's sample
            name, label = word.split(".Labels.", 1)
            sample = self.vars[name]
            assert isinstance(sample, tuple)
            return str(sample[0].get(label, ""))
        try:
            return float(word)
        except ValueError:
            raise ValueError(f"template operand not supported: {word}") from None

    def call(self, name: str, args: list[object]) -> object:
        if name == "or":
            return next((a for a in args if _truthy(a)), args[-1])
        if name == "eq":
            return args[0] == args[1]
        if name in ("le", "gt"):
            a, b = float(args[0]), float(args[1])  # type: ignore[arg-type]
            return a <= b if name == "le" else a > b
        if name == "printf":
            return _printf(str(args[0]), *args[1:])
        if name == "query":
            return list(self.query(str(args[0]))) if self.query else []
        if name == "sortByLabel":
            label, seq = str(args[0]), args[1]
            assert isinstance(seq, list)
            return sorted(seq, key=lambda sample: str(sample[0].get(label, "")))
        if name == "first":
            seq = args[0]
            assert isinstance(seq, list)
            return seq[0]
        if name == "value":
            return float(args[0][1])  # type: ignore[index]
        if name == "humanize":
            return humanize(float(args[0]))  # type: ignore[arg-type]
        if name == "humanizePercentage":
            return humanize_percentage(float(args[0]))  # type: ignore[arg-type]
        if name == "humanizeDuration":
            return humanize_duration(float(args[0]))  # type: ignore[arg-type]
        raise ValueError(f"template function not supported: {name}")

    def pipe(self, text: str, dot: object) -> object:
        result: object = None
        for i, command in enumerate(c.strip() for c in _split_pipe(text)):
            words = _WORD.findall(command)
            head, rest = words[0], words[1:]
            if head.startswith(("$", '"', ".")) or re.fullmatch(r"-?[\d.]+", head):
                if rest:
                    raise ValueError(f"not a function: {head}")
                result = self.operand(head, dot)
                continue
            args = [self.operand(w, dot) for w in rest]
            if i > 0:
                args.append(result)
            result = self.call(head, args)
        return result


def _split_pipe(text: str) -> list[str]:
    parts, current, quoted, depth = [], "", False, 0
    for i, ch in enumerate(text):
        if ch == '"' and (i == 0 or text[i - 1] != "\\"):
            quoted = not quoted
        if not quoted:
            depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "|" and not quoted and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    return parts


def _run(nodes: list[_Node], scope: _Scope, dot: object) -> str:
    out = []
    for node in nodes:
        if node.kind == "text":
            out.append(node.text)
        elif node.kind == "action":
            v = scope.pipe(node.pipe, dot)
            out.append(go_g4(v) if isinstance(v, float) else str(v))
        elif node.kind == "assign":
            scope.vars[node.text] = scope.pipe(node.pipe, dot)
        elif node.kind == "range":  # {{ range $i, $x := PIPE }}: each element, its index and itself
            names, pipe = node.pipe.split(":=", 1)
            index, element = (n.strip() for n in names.split(","))
            items = scope.pipe(pipe.strip(), dot)
            assert isinstance(items, list)
            for n, item in enumerate(items):
                scope.vars[index], scope.vars[element] = n, item
                out.append(_run(node.then, scope, item))
            if not items:
                out.append(_run(node.otherwise, scope, dot))
        else:
            v = scope.pipe(node.pipe, dot)
            if _truthy(v):
                out.append(_run(node.then, scope, v if node.kind == "with" else dot))
            else:
                out.append(_run(node.otherwise, scope, dot))
    return "".join(out)


def render(text: str, labels: Mapping[str, str], value: float, query: Query | None = None) -> str:
    """``text`` as Prometheus renders it for an alert with ``labels`` and ``value``; ``query``
    answers the template's queries (none: every query returns nothing)."""
    return _run(_parse(text), _Scope(labels, value, query), None)
