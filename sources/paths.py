"""The HTTP paths kvdoctor's servers answer and its clients read, where more than one layer names them."""

from __future__ import annotations

METRICS_PATH = "/metrics"  # Prometheus' convention: an engine's, dcgm-exporter's and the exporter's page
HEALTHZ_PATH = "/healthz"
READYZ_PATH = "/readyz"
# Kubernetes probes carry no credentials: the exporter and the dashboard answer them without basic auth.
PROBE_PATHS = frozenset({HEALTHZ_PATH, READYZ_PATH})
