"""What the tests and the benchmarks share (bench/ imports nothing else from tests/).

- tools: where the external tools are, the ``needs_tools`` marker, free ports, ``wait_until``
- servers: ``FakeServer``, the one fake HTTP server, its answers and faults chosen by the test
- processes: ``Process``, the one way to run a command in another process (ready, captured, stopped)
- prometheus: a real Prometheus on loopback and its HTTP API
- demo: ``kvdoctor demo`` as a real process, or the same pipeline in this process, with its URLs
- exporter_rig: a real exporter in this process scraping an engine URL, reading its own page back
- fixtures: the pytest fixtures over these (loaded by tests/conftest.py)
- scenarios: the rules' scenario suite (canonical series and the verdict each must give)
- synthetic: synthetic engine series, the exporter's and Prometheus' APIs faked over them, backfill
- models: a tiny model's config.json
- browser: headless Chromium for the dashboard's browser tests
"""
