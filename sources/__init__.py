"""kvdoctor.sources: all reading from outside the process: one client per API on one small HTTP
helper, and the files a user hands in.

- ``http``: the helper (one deadline per answer, a size cap, no redirects, one ``SourceError`` line);
- ``exporter_api``: the kvdoctor exporter's API (window, diagnosis, status, /metrics);
- ``prometheus``: the Prometheus HTTP API (instant and range queries, canonical windows);
- ``traces``: trace files; ``recording``: what ``kvdoctor record`` polls and writes;
- ``model_files``: a model's config.json, folder or Hugging Face cache entry -> ``ModelShape``;
- ``thresholds_file``: ``--thresholds FILE`` (YAML) -> ``Thresholds``.
"""
