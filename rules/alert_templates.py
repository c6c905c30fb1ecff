"""The alerts' annotation templates: the forms of Go's text/template the alerts use, built here
so that every annotation reads well with or without Kubernetes labels.

Prometheus and vmalert expand an alert's annotations with Go templates. The alerts use a small set
of forms, made by the helpers below:

- ``engine()``: the engine's name, its ``pod`` label, else ``instance``, else ``job``;
- ``slo()``: the pod's own ITL SLO (``kvdoctor:itl_slo_seconds``, a query made when the alert
  fires), in milliseconds;
- ``value(kind)``: ``$value`` in the unit people read (``184ms``, ``72.5%``, ``1.2G``);
- ``if``/``with``/``range``/``else``/``end``, ``or``, ``eq``, ``le``, ``gt``, ``printf``, ``query``, ``sortByLabel``,
  ``first``, ``value``, and ``( ... )`` around an argument (``label(name)``).

The tests expand exactly these forms as Prometheus does (tests/support/go_templates.py: promtool's
expected annotations, the check that nothing renders empty or leaves a template behind); anything
else is an error there, so a new form cannot slip by untested.
"""

from __future__ import annotations

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
