"""Per-source accounting: what each source answered, its error counts, and the self metrics.

Every cycle each source's ``Outcome`` is recorded here:

- ``ok``              -> ``kvdoctor_source_up{source} 1``; ``partial_errors`` are counted in
                         ``kvdoctor_source_errors_total{source,reason}`` but the source stays up
- ``not_applicable``  -> no ``source_up`` series at all (nothing to collect here, not an error)
- ``error``/``timeout`` -> ``source_up 0``, ``errors_total{reason}`` + 1

Error reasons are label values, so their number per source is bounded (the rest are ``other``).
``/api/v1/status`` reads ``SourceStatus.to_json`` of every source.

``ProcessSamples`` adds what every Prometheus exporter serves about itself, on the page only (not
stored in the window): ``kvdoctor_build_info{version,revision,python} 1`` and the standard
``process_*`` metrics, read from ``/proc/self`` (two small reads per cycle).
"""

from __future__ import annotations

import json
import logging
import os
import platform
import re
import resource
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import kvdoctor
from kvdoctor.signals import vocabulary as S
from kvdoctor.signals.collection import Collected
from kvdoctor.signals.records import attributes
from kvdoctor.signals.window import Labels, SeriesKey

log = logging.getLogger("kvdoctor.exporter")

MAX_REASONS_PER_SOURCE = 16  # error reasons are label values: keep their number bounded

_REASON_CHARS = re.compile(r"[^a-z0-9_]+")


def clean_reason(reason: Any) -> str:
    """A reason as a short snake_case label value."""
    text = _REASON_CHARS.sub("_", str(reason).strip().lower()).strip("_")[:64]
    return text or "unknown"


@dataclass
class Outcome:
    """One source's answer in one cycle."""

    kind: str  # "ok" | "not_applicable" | "error" | "timeout"
    duration: float
    collected: Collected | None = None
    reason: str = ""
    message: str = ""


@dataclass
class SourceStatus:
    """What ``/api/v1/status`` says about one source."""

    name: str
    applicable: bool | None = None  # None until the source has been asked once
    up: bool | None = None
    last_scrape: float | None = None  # when the last answer (or timeout) came
    last_success: float | None = None
    duration_seconds: float | None = None
    series: int = 0
    last_error: str | None = None
    last_error_reason: str | None = None
    last_error_at: float | None = None
    errors: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {
            **attributes(
                self,
                "name applicable up last_scrape last_success duration_seconds series "
                "last_error last_error_reason last_error_at",
            ),
            "errors": dict(self.errors),
        }


class SourceAccounting:
    """The status and error counters of every source; safe to read from any thread."""

    def __init__(self, names: Iterable[str]):
        self._lock = threading.RLock()  # guards status reads against the cycle's writes
        self._status = {name: SourceStatus(name) for name in names}
        self._errors: dict[tuple[str, str], int] = {}

    def status_json(self) -> dict[str, dict]:
        with self._lock:
            return {name: st.to_json() for name, st in self._status.items()}

    @property
    def error_series(self) -> int:
        """How many ``source_errors_total`` series there are."""
        return len(self._errors)

    def count_error(self, source: str, reason: str) -> int:
        """Count one error of ``source``; returns the new count of its (possibly bounded) reason."""
        with self._lock:
            known = (source, reason) in self._errors
            if not known and sum(1 for s, _ in self._errors if s == source) >= MAX_REASONS_PER_SOURCE:
                reason = "other"
            count = self._errors[(source, reason)] = self._errors.get((source, reason), 0) + 1
            status = self._status.get(source)
            if status is not None:
                status.errors[reason] = status.errors.get(reason, 0) + 1
            return count

    def record(self, outcomes: Mapping[str, Outcome], kept: Mapping[str, int], ts: float) -> None:
        """One cycle's outcomes; ``kept`` is how many series of each source went into the snapshot."""
        with self._lock:
            for name, outcome in outcomes.items():
                self._record(self._status.setdefault(name, SourceStatus(name)), outcome, kept.get(name, 0), ts)

    def _record(self, st: SourceStatus, outcome: Outcome, kept: int, ts: float) -> None:
        name = st.name
        if outcome.kind == "not_applicable":
            if st.applicable is not False:
                log.info("source %s: not applicable here%s", name, f" ({outcome.message})" if outcome.message else "")
            st.applicable, st.up = False, None
            return
        st.applicable = True
        st.last_scrape = ts
        st.duration_seconds = outcome.duration
        if outcome.kind == "ok":
            if st.up is False:
                log.info("source %s: up again", name)
            st.up = True
            st.last_success = ts
            st.series = kept
            for reason in outcome.collected.partial_errors if outcome.collected else ():
                self.count_error(name, clean_reason(reason))
            return
        if st.up is not False or st.last_error_reason != outcome.reason:
            log.warning("source %s down: %s (%s)", name, outcome.reason, outcome.message)
        st.up = False
        st.series = 0
        st.last_error = outcome.message or outcome.reason
        st.last_error_reason = outcome.reason
        st.last_error_at = ts
        self.count_error(name, outcome.reason)

    def self_samples(self, key: Callable[[str, Labels], SeriesKey]) -> Iterator[tuple[SeriesKey, float]]:
        """``source_up``, ``source_scrape_duration_seconds`` and ``source_errors_total`` samples."""
        for name, st in self._status.items():
            if not st.applicable:
                continue
            source = (("source", name),)
            yield key(S.SOURCE_UP, source), 1.0 if st.up else 0.0
            yield key(S.SOURCE_SCRAPE_DURATION, source), float(st.duration_seconds or 0.0)
        for (source, reason), count in sorted(self._errors.items()):
            yield key(S.SOURCE_ERRORS, (("reason", reason), ("source", source))), float(count)


# ------------------------------------------------------------------------- build info, process


def build_revision(package_dir: Path | None = None) -> str:
    """The source revision of the running kvdoctor: the ``REVISION`` file the image build writes
    into the installed package, else the commit pip recorded for a VCS install (PEP 610
    ``direct_url.json``), else the git checkout an editable install runs from; "unknown" otherwise."""
    package = package_dir or Path(kvdoctor.__file__).resolve().parent
    try:
        written = (package / "REVISION").read_text().strip()
    except OSError:
        written = ""
    if written:
        return written
    try:
        direct = json.loads(metadata.distribution("kvdoctor").read_text("direct_url.json") or "{}")
        commit = direct.get("vcs_info", {}).get("commit_id")
    except (metadata.PackageNotFoundError, ValueError, AttributeError):
        commit = None
    return str(commit) if commit else _git_head(package.parent) or "unknown"


def _git_head(root: Path) -> str | None:
    """The commit checked out in ``root`` (read from .git, no git command); None if not a checkout."""
    git = root / ".git"
    try:
        if git.is_file():  # a worktree: "gitdir: PATH"
            git = (root / git.read_text().strip().removeprefix("gitdir:").strip()).resolve()
        head = (git / "HEAD").read_text().strip()
        if not head.startswith("ref:"):
            return head or None
        ref = head.removeprefix("ref:").strip()
        common = git / "commondir"
        base = (git / common.read_text().strip()).resolve() if common.is_file() else git
        for folder in (git, base):
            if (folder / ref).is_file():
                return (folder / ref).read_text().strip() or None
        for line in (base / "packed-refs").read_text().splitlines():
            if line.endswith(" " + ref):
                return line.split(" ", 1)[0]
    except OSError:
        return None
    return None


class ProcessSamples:
    """``kvdoctor_build_info`` and the standard ``process_*`` metrics of this process."""

    def __init__(self, revision: str | None = None):
        labels = (("python", platform.python_version()), ("revision", revision or build_revision()))
        self._build_labels = (*labels, ("version", kvdoctor.__version__))
        self._page_size = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        self._start_time = _start_time()

    def samples(self, key: Callable[[str, Labels], SeriesKey]) -> Iterator[tuple[SeriesKey, float]]:
        yield key(S.BUILD_INFO, self._build_labels), 1.0
        times = os.times()
        yield key(S.PROCESS_CPU_SECONDS, ()), times.user + times.system
        yield key(S.PROCESS_MAX_FDS, ()), float(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        if self._start_time is not None:
            yield key(S.PROCESS_START_TIME, ()), self._start_time
        try:
            with open("/proc/self/statm", "rb") as statm:
                size, resident = statm.read().split()[:2]
            open_fds = len(os.listdir("/proc/self/fd"))
        except (OSError, ValueError):
            return  # no /proc (not Linux): the portable ones only
        yield key(S.PROCESS_VIRTUAL_MEMORY, ()), float(int(size) * self._page_size)
        yield key(S.PROCESS_RESIDENT_MEMORY, ()), float(int(resident) * self._page_size)
        yield key(S.PROCESS_OPEN_FDS, ()), float(open_fds)


def _start_time() -> float | None:
    """When this process started (Unix seconds): boot time plus its start in clock ticks."""
    try:
        stat = Path("/proc/self/stat").read_bytes()
        fields = stat[stat.rindex(b")") + 2 :].split()  # after "pid (comm) "; comm may hold spaces
        lines = Path("/proc/stat").read_text().splitlines()
        boot = next(float(line.split()[1]) for line in lines if line.startswith("btime"))
        return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None
