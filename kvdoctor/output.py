"""Where a command's document goes: stdout, or a file replaced in one step (never left half written)."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from kvdoctor.errors import UsageError
from kvdoctor.rules import links


def write_document(text: str, output: str | None) -> None:
    """``text`` to stdout (``output`` None or ``-``) or to the file ``output``: written beside it and
    renamed over it, keeping an existing file's mode (a new one gets the umask's). A path that cannot
    be written raises ``UsageError`` with one line."""
    if not output or output == "-":
        sys.stdout.write(text)
        return
    target = Path(output)
    if target.is_dir():
        raise UsageError(f"cannot write {output}: it is a directory")
    if not target.parent.is_dir():
        raise UsageError(f"cannot write {output}: directory {target.parent} does not exist")
    try:
        mode = target.stat().st_mode & 0o777 if target.exists() else 0o666 & ~_umask()
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
        try:
            with os.fdopen(fd, "w") as fh:
                fh.write(text)
            os.chmod(tmp, mode)  # mkstemp creates 0600; the document is meant to be read by others
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise UsageError(f"cannot write {output}: {exc.strerror or exc}") from None


def check_document(text: str, output: str | None, regenerate: str) -> int:
    """``--check``: 0 when the file ``output`` holds ``text``, else 1 with one line saying how to
    regenerate it (``regenerate``: the command, without its ``-o``)."""
    if not output or output == "-":
        raise UsageError("--check needs -o FILE to compare with")
    try:
        current = Path(output).read_text()
    except OSError as exc:
        raise UsageError(f"cannot read {output}: {exc.strerror or exc}") from None
    if current != text:
        print(f"{output} is out of date; regenerate it with: {regenerate} -o {output}", file=sys.stderr)
        return 1
    return 0


def runbook_base(text: str | None) -> str:
    """``--runbook-base-url`` checked and ending in ``/`` (``rules export`` and ``grafana export``
    alike); a bad one is a ``UsageError``."""
    try:
        return links.runbook_base(text)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def dashboard_base(text: str | None) -> str | None:
    """``--dashboard-base-url`` (the dashboard's external address) checked; a bad one is a ``UsageError``."""
    try:
        return links.absolute_base(text, "--dashboard-base-url", "https://kvdoctor.example.com/")
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def check_writable_file(path: str, flag: str) -> None:
    """Refuses (``UsageError`` naming ``flag``) a file path no file can be written at: a folder, a
    missing folder, or one where creating a file fails (read-only, ``/proc``). Checked by making
    and removing a file beside it, so it holds as root too."""
    target = Path(path)
    if target.is_dir():
        raise UsageError(f"{flag} {path}: is a directory")
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        raise UsageError(f"{flag} {path}: folder {parent} does not exist")
    _try_to_write(parent, f"{flag} {path}")


def check_folder_writable(path: str, flag: str) -> None:
    """Refuses (``UsageError`` naming ``flag``) a report folder that could not be made or written
    in: not a folder, or a place where nothing can be created (read-only, ``/proc``). Nothing is
    left behind: the folder itself is made when the report is written."""
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"{flag} {path}: exists and is not a folder")
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise UsageError(f"{flag} {path}: {existing} is not a folder")
    try:
        trial = tempfile.mkdtemp(dir=existing, prefix=".kvdoctor-write-check.")
    except OSError as exc:
        raise UsageError(f"{flag} {path}: cannot write in {existing}: {exc.strerror or exc}") from None
    os.rmdir(trial)


def _try_to_write(folder: Path, what: str) -> None:
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".kvdoctor-write-check.")
    except OSError as exc:
        raise UsageError(f"{what}: cannot write in {folder}: {exc.strerror or exc}") from None
    os.close(fd)
    Path(probe).unlink(missing_ok=True)
