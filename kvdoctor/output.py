"""Where a command's document goes: stdout, or a file replaced in one step (never left half written)."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from kvdoctor.errors import UsageError


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


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current
