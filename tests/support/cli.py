"""Running ``kvdoctor`` in-process as a test does: the exit status, whether ``main`` returns it or
argparse exits with it from inside ``parse_args``."""

from __future__ import annotations

from collections.abc import Callable, Sequence


def exit_status(main: Callable[[list[str]], int], args: Sequence[str]) -> int | str | None:
    """``main(args)``'s exit status; a ``SystemExit``'s code when it refused while parsing."""
    try:
        return main(list(args))
    except SystemExit as exc:  # refused while parsing, as argparse does
        return exc.code
