"""The project's rule for bad input, checked once: a clear one-line error, never a traceback."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest


def one_line_error(error: type[BaseException], call: Callable[..., object], *args: Any, **kwargs: Any) -> str:
    """The message of the ``error`` that ``call(*args, **kwargs)`` must raise, checked to be one
    non-empty line."""
    with pytest.raises(error) as raised:
        call(*args, **kwargs)
    message = str(raised.value)
    assert message and "\n" not in message, message
    return message
