"""Units and number formats for people: bytes, durations, percentages, rates.

Every number kvdoctor prints for a person goes through here, so the headlines, the CLI, the
dashboard and the stress report write a quantity the same way. The options reproduce each
caller's layout; ``missing``, where a function takes it, is what None, NaN or an infinity prints
as (unset: the value is formatted as it is).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

KIB = 1024
MIB = 1024 * 1024
GIB = 1024**3
KB = 1e3
MB = 1e6
GB = 1e9
MISSING = "–"

# The units a windowed feature is given in (``Feature.unit``) and evidence carries.
RATIO = "ratio"
SECONDS = "seconds"
BYTES_PER_SECOND = "bytes/s"
TOKENS_PER_SECOND = "tokens/s"
PER_MINUTE = "per minute"
REQUESTS = "requests"

Scale = tuple[float, str, int]  # (divisor, and the least value shown in this unit; unit; decimals)

# Prose (headlines, actions): "17.2 GB", "64 MiB", "256 KiB".
BYTES: tuple[Scale, ...] = ((GB, "GB", 1), (MIB, "MiB", 0), (KIB, "KiB", 0))
# Tables (kvdoctor ledger): one decimal throughout, "17.2 GB", "3.1 MB", "128.0 KiB".
BYTES_TABLE: tuple[Scale, ...] = ((GB, "GB", 1), (MB, "MB", 1), (KIB, "KiB", 1))
# Measured transfer rates (kvdoctor diagnose's evidence): "1.25 GB/s", "640 B/s".
BYTE_RATES: tuple[Scale, ...] = ((GB, "GB/s", 2), (MB, "MB/s", 2), (KB, "kB/s", 2), (1, "B/s", 0))


def fmt_scaled(value: float, scales: Sequence[Scale]) -> str:
    """``value`` in the first of ``scales`` it reaches, else in the last one: ``2.5 GB``."""
    divisor, unit, decimals = scales[-1]
    for scale in scales:
        if value >= scale[0]:
            divisor, unit, decimals = scale
            break
    return f"{value / divisor:.{decimals}f} {unit}"


def fmt_bytes(n: float, scales: Sequence[Scale] = BYTES) -> str:
    """A byte count: ``17.2 GB``, ``64 MiB``, ``256 KiB`` (``BYTES_TABLE``: ``128.0 KiB``)."""
    return fmt_scaled(n, scales)


def fmt_bytes_exact(n: float) -> str:
    """Whole bytes below a megabyte, KiB beside them: ``57,344 B (56.0 KiB)``; above, ``17.18 GB``."""
    if n < MB:
        return f"{n:,.0f} B ({n / KIB:,.1f} KiB)"
    return f"{n / GB:,.2f} GB"


def fmt_ms(
    seconds: float | None, decimals: int = 1, *, trim: bool = False, grouping: bool = False, missing: str | None = None
) -> str:
    """Seconds as milliseconds: ``11.2 ms``; ``trim`` drops a trailing ``.0`` (``100 ms``). None
    prints as ``missing`` (default ``MISSING``), and so do NaN and infinities when it is given."""
    if seconds is None or (missing is not None and not math.isfinite(seconds)):
        return MISSING if missing is None else missing
    text = f"{seconds * 1000:{',' if grouping else ''}.{decimals}f}"
    if trim and text.endswith(".0"):
        text = text[:-2]
    return text + " ms"


def fmt_seconds(seconds: float, decimals: int = 2) -> str:
    """Seconds, always: a time to first token reads the same unit on every surface (``0.35 s``)."""
    return f"{seconds:.{decimals}f} s"


def fmt_duration(seconds: float, decimals: int = 2) -> str:
    """Milliseconds below a second, seconds from one: ``9.92 ms``, ``1.25 s``; ``inf`` if endless."""
    if math.isinf(seconds):
        return "inf"
    return fmt_ms(seconds, decimals) if seconds < 1 else f"{seconds:.{decimals}f} s"


def fmt_pct(ratio: float | None, decimals: int = 0, *, missing: str | None = None) -> str:
    """A ratio as a percentage: ``0.914`` -> ``91%`` (None, NaN, infinities: as ``fmt_ms``)."""
    if ratio is None or (missing is not None and not math.isfinite(ratio)):
        return MISSING if missing is None else missing
    return f"{ratio * 100:.{decimals}f}%"


def fmt_number(
    value: float | None, unit: str = "", decimals: int = 1, *, grouping: bool = True, missing: str = MISSING
) -> str:
    """A number with thousands separators and its unit: ``1,234.5 tokens/s``."""
    if value is None or not math.isfinite(value):
        return missing
    return f"{value:{',' if grouping else ''}.{decimals}f}" + (f" {unit}" if unit else "")


def fmt_in_unit(value: float | None, unit: str, missing: str = "-") -> str:
    """A feature's value in the unit the tree gives it (``Feature.unit``), as a CLI table shows it."""
    if value is None or math.isnan(value):
        return missing
    v = float(value)
    if unit == SECONDS:
        return fmt_ms(v)
    if unit == RATIO:
        return f"{v:.3f}"
    if unit == BYTES_PER_SECOND:
        return fmt_scaled(v, BYTE_RATES)
    if unit == TOKENS_PER_SECOND:
        return f"{v:.1f} tokens/s"
    if unit == PER_MINUTE:
        return f"{v:.2f}/min"
    return f"{v:.4g}" + (f" {unit}" if unit else "")


def round_significant(value: float, digits: int = 3) -> float:
    """``value`` rounded to ``digits`` significant digits (a non-finite one as it is)."""
    return float(f"{value:.{digits}g}") if math.isfinite(value) else value


def plural(count: float, noun: str, plural_form: str | None = None) -> str:
    """``1 snapshot``, ``2 snapshots``, ``1 request``: a count with its noun in the right number."""
    shown = f"{count:,.0f}" if float(count).is_integer() else f"{count:,.1f}"
    return f"{shown} {noun if count == 1 else (plural_form or noun + 's')}"
