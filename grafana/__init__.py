"""The Grafana dashboard, generated from the rules' definitions (``kvdoctor grafana export``)."""
