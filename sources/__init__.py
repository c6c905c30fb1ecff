"""kvdoctor.sources: one client per API, on one small HTTP helper.

- ``http``: the helper (one deadline per answer, a size cap, no redirects, one ``SourceError`` line);
- ``exporter_api``: the kvdoctor exporter's API (window, diagnosis, status, /metrics);
- ``prometheus``: the Prometheus HTTP API (instant and range queries, canonical windows);
- ``traces``: trace files; ``recording``: what ``kvdoctor record`` polls and writes.
"""
