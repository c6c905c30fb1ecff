"""The test suite's root: makes ``tests.*`` importable and loads the shared fixtures.

The fixtures and the ``needs_tools`` hook live in tests/support/fixtures.py; tests/support/ is the
one support package the tests and the benchmarks share.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Let tests import `tests.support` whichever way pytest was started. Appended, not prepended: the
# product folders (rules/, exporter/, dashboard/) must not shadow anything as top-level packages;
# the code is imported as the installed `kvdoctor.*`.
_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:
    sys.path.append(_ROOT)

pytest_plugins = ["tests.support.fixtures"]
