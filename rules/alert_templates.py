"""The alerts' annotation templates, and a renderer for the part of Go's text/template they use.

Prometheus and vmalert expand an alert's annotations with Go templates. The alerts here use a small
set of forms, built by the helpers below, so that every annotation reads well with or without
Kubernetes labels:

- ``engine()``: the engine's name, its ``pod`` label, else ``instance``, else ``job``;
- ``slo()``: the pod's own ITL SLO (``kvdoctor:itl_slo_seconds``, a query made when the alert
  fires), in milliseconds;
- ``value(kind)``: ``$value`` in the unit people read (``184ms``, ``72.5%``, ``1.2G``);
- ``if``/``with``/``range``/``else``/``end``, ``or``, ``eq``, ``le``, ``gt``, ``printf``, ``query``, ``sortByLabel``,
  ``first``, ``value``, and ``( ... )`` around an argument (``label(name)``).

``render`` expands exactly these forms as Prometheus does (for tests: promtool's expected
annotations, the check that nothing renders empty or leaves a template behind). Anything else is an
error, so a new form cannot slip by untested.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from kvdoctor.signals.units import go_g4, humanize, humanize_percentage

Sample = tuple[Mapping[str, str], float]
Query = Callable[[str], Sequence[Sample]]

# The labels that name an engine, in the order an annotation prefers them.
NAME_LABELS = ("pod", "instance", "job")
# What the labels of one engine's records are matched on in a template query.
IDENTITY_LABELS = ("namespace", "pod", "instance")


# ------------------------------------------------------------------------------ the forms


def engine() -> str:
    """The engine's name: ``pod``, else ``instance``, else ``job``."""
    return "{{ or " + " ".join(f"$labels.{n}" for n in NAME_LABELS) + ' "an unnamed engine" }}'


def label(name: str) -> str:
    """An argument: the alert's label ``name``, "" where it has none. vmalert's templates give a
    missing label as nil (``printf "%q"`` writes ``%!q(<nil>)``), Prometheus' as ""; this is "" on both."""
    return f'(or $labels.{name} "")'


def selector(record: str, fixed: str = "", suffix: str = "") -> str:
    """A template expression: ``record`` for this alert's engine (its identity labels, empty ones
    matching series without them; ``fixed`` matchers first, e.g. ``verdict=\\"x\\"``), for ``query``."""
    matchers = ",".join([*([fixed] if fixed else []), *(f"{k}=%q" for k in IDENTITY_LABELS)])
    args = " ".join(label(k) for k in IDENTITY_LABELS)
    return f'printf "{record}{{{matchers}}}{suffix}" {args}'


def slo(record: str) -> str:
    """The pod's SLO (``record``, seconds) in milliseconds, queried when the alert fires."""
    return (
        "{{ with "
        + selector(record)
        + " | query }}{{ . | first | value | humanizeDuration }}{{ else }}unknown{{ end }}"
    )


def value(kind: str) -> str:
    """``$value`` in a unit people read: ``duration`` (184ms), ``percent`` (72.5%), ``bytes_rate``
    (1.2GB/s), ``number`` (382.9)."""
    if kind == "duration":
        return "{{ $value | humanizeDuration }}"
    if kind == "percent":
        return "{{ $value | humanizePercentage }}"
    if kind == "bytes_rate":
        return "{{ $value | humanize }}B/s"
    if kind == "number":
        return "{{ $value | humanize }}"
    raise ValueError(f"unknown value kind {kind!r}")


def prose_duration(seconds: float) -> str:
    """A duration for a sentence: ``1 hour``, ``5 minutes``, ``20 seconds``, ``1.5 minutes``."""
    for unit, size in (("hour", 3600.0), ("minute", 60.0), ("second", 1.0)):
        if seconds >= size or unit == "second":
            n = seconds / size
            text = f"{n:g}" if n == round(n) else f"{n:.1f}"
            return f"{text} {unit}" + ("" if text == "1" else "s")
    raise AssertionError("unreachable")


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
