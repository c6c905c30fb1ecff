"""The one set of number formats: each layout a caller prints, pinned."""

from __future__ import annotations

import math

import pytest

from kvdoctor.signals import units as U


@pytest.mark.parametrize(
    "n, prose, table",
    [
        (262_144, "256 KiB", "256.0 KiB"),
        (65_536, "64 KiB", "64.0 KiB"),
        (3_145_728, "3 MiB", "3.1 MB"),
        (17_179_869_184, "17.2 GB", "17.2 GB"),
        (512, "0 KiB", "0.5 KiB"),
    ],
)
def test_bytes_in_prose_and_in_tables(n, prose, table):
    assert U.fmt_bytes(n) == prose
    assert U.fmt_bytes(n, U.BYTES_TABLE) == table


def test_exact_bytes_and_byte_rates():
    assert U.fmt_bytes_exact(57_344) == "57,344 B (56.0 KiB)"
    assert U.fmt_bytes_exact(17_179_869_184) == "17.18 GB"
    assert U.fmt_in_unit(1.25e9, U.BYTES_PER_SECOND) == "1.25 GB/s"
    assert U.fmt_in_unit(2.5e4, U.BYTES_PER_SECOND) == "25.00 kB/s"
    assert U.fmt_in_unit(640.4, U.BYTES_PER_SECOND) == "640 B/s"


def test_milliseconds_durations_and_percentages():
    assert U.fmt_ms(0.0112, trim=True) == "11.2 ms" and U.fmt_ms(0.1, trim=True) == "100 ms"
    assert U.fmt_ms(0.1) == "100.0 ms" and U.fmt_ms(1.23456, 2, grouping=True) == "1,234.56 ms"
    assert U.fmt_ms(math.nan, missing=U.MISSING) == "–" and U.fmt_ms(None) == "–"
    assert U.fmt_duration(0.00992) == "9.92 ms" and U.fmt_duration(1.25) == "1.25 s"
    assert U.fmt_duration(math.inf) == "inf"
    assert U.fmt_pct(0.914) == "91%" and U.fmt_pct(0.0312, 1) == "3.1%"
    assert U.fmt_pct(math.nan, missing=U.MISSING) == "–" and U.fmt_pct(math.nan) == "nan%"


def test_numbers_and_feature_units():
    assert U.fmt_number(1234.56, "tokens/s") == "1,234.6 tokens/s"
    assert U.fmt_number(3, decimals=0) == "3" and U.fmt_number(None) == "–"
    assert U.fmt_in_unit(None, U.SECONDS) == "-" and U.fmt_in_unit(math.nan, U.RATIO) == "-"
    assert U.fmt_in_unit(0.0118, U.SECONDS) == "11.8 ms" and U.fmt_in_unit(0.91234, U.RATIO) == "0.912"
    assert U.fmt_in_unit(1.5, U.PER_MINUTE) == "1.50/min" and U.fmt_in_unit(2.0, U.REQUESTS) == "2 requests"
    assert U.round_significant(0.123456) == 0.123 and math.isnan(U.round_significant(math.nan))
