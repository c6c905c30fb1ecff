"""The dashboard serves every alert's runbook at /runbooks/<Alert>, the absolute runbook_url."""

from __future__ import annotations

import yaml

from kvdoctor.dashboard.app import create_app
from kvdoctor.rules import rule_file


def _client():
    return create_app(exporter_url="http://127.0.0.1:1").server.test_client()


def test_every_alert_has_a_runbook_page_and_nothing_else_is_served():
    client = _client()
    doc = yaml.safe_load(rule_file.render_rules_yaml(runbook_base_url="https://kv.example.com/runbooks/"))
    for rule in (r for g in doc["groups"] for r in g["rules"] if "alert" in r):
        path = rule["annotations"]["runbook_url"].removeprefix("https://kv.example.com")
        resp = client.get(path)
        assert resp.status_code == 200, path
        assert rule["alert"] in resp.get_data(as_text=True) and resp.mimetype == "text/html"
        assert client.get(path.removesuffix(".md")).status_code == 200
    for bad in ("/runbooks/README", "/runbooks/Nope", "/runbooks/a.b"):
        assert client.get(bad).status_code == 404, bad
    escape = client.get("/runbooks/..%2Fpyproject.toml")  # the Dash shell at most, never the file
    assert "[project]" not in escape.get_data(as_text=True)
