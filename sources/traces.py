"""Trace files: reading and writing the OpenMetrics traces of ``kvdoctor.signals.trace``.

Reading checks that the file is text before parsing, so a wrong path is one clear line
(``TraceError``); writing is atomic, so a reader never sees half a trace.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from kvdoctor.signals.trace import RawNormaliser, Trace, TraceError, format_raw_captures, format_window, parse_trace
from kvdoctor.signals.window import Window

__all__ = ["load_trace", "write_raw_captures", "write_window"]


def load_trace(path: str | os.PathLike[str], normaliser: RawNormaliser | None = None) -> Trace:
    """Read the trace in ``path`` (see ``signals.trace.parse_trace``); ``TraceError`` if unusable."""
    try:
        data = Path(path).read_bytes()
    except IsADirectoryError:
        raise TraceError(f"{path} is a directory, not a trace file") from None
    except OSError as exc:
        raise TraceError(f"cannot read {path}: {exc.strerror or exc}") from None
    if b"\x00" in data:
        raise TraceError(f"{path} is a binary file, not an OpenMetrics trace")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise TraceError(f"{path} is not UTF-8 text, not an OpenMetrics trace") from None
    return parse_trace(text, normaliser=normaliser, source=str(path))


def write_window(window: Window, path: str | os.PathLike[str]) -> int:
    """Write ``window`` as a trace to ``path`` (atomically); returns the number of snapshots."""
    _write_atomically(path, format_window(window))
    return len(window)


def write_raw_captures(captures: Iterable[tuple[float, str]], path: str | os.PathLike[str]) -> None:
    """Write raw exposition pages with their timestamps as a trace to ``path`` (atomically)."""
    _write_atomically(path, format_raw_captures(captures))


def _write_atomically(path: str | os.PathLike[str], text: str) -> None:
    """Readers never see half a file: write a temporary file next to it, then rename."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(
        prefix=f".{target.name}.", suffix=".tmp", dir=target.parent if str(target.parent) else "."
    )
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as fh:
            fh.write(text)
        os.chmod(tmp, _file_mode(target))  # mkstemp makes 0600; a trace is an ordinary file
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _file_mode(target: Path) -> int:
    """The replaced file's mode, or what ``open()`` would give a new file under the umask."""
    try:
        return target.stat().st_mode & 0o777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask
