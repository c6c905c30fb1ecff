"""The environment kvdoctor reads: every variable is named ``KVDOCTOR_<SETTING>``.

The exporter's and the CLI's settings use ``ENV_PREFIX`` as it is; the dashboard's add
``DASHBOARD_`` to it (``dashboard/settings.py``).
"""

from __future__ import annotations

ENV_PREFIX = "KVDOCTOR_"
