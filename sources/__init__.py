"""kvdoctor.sources: one client per API (exporter HTTP API, Prometheus HTTP API, trace files)."""
