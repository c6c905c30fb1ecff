"""The Helm chart ships the generated dashboard as a ConfigMap Grafana's dashboard sidecar picks up:
rendered by the real helm, valid against the Kubernetes schema, carrying exactly the committed JSON."""

from __future__ import annotations

import json
import tarfile

import kubernetes_validate
import pytest

from tests.grafana import board as B
from tests.helm.chart import Helm, chart_under_test
from tests.support import tools

pytestmark = tools.requires_helm

K8S_VERSION = "1.30.0"
# kubectl's client-side apply (and Argo CD by default) copies the object into an annotation,
# which may hold 256 KiB.
LAST_APPLIED_LIMIT = 256 * 1024
SET = "monitoring.grafanaDashboard"


@pytest.fixture(scope="module")
def helm() -> Helm:
    return Helm(tools.require("helm"), chart_under_test())


def dashboard_config_map(rendered) -> dict:
    (config_map,) = [d for d in rendered.all("ConfigMap") if "kvdoctor.json" in (d.get("data") or {})]
    return config_map


def test_the_default_install_ships_the_committed_dashboard_for_the_sidecar(helm):
    config_map = dashboard_config_map(helm.render("default"))
    kubernetes_validate.validate(config_map, K8S_VERSION, strict=True)
    labels = config_map["metadata"]["labels"]
    assert labels["grafana_dashboard"] == "1"
    assert labels["app.kubernetes.io/component"] == "grafana-dashboard"
    assert "namespace" not in config_map["metadata"]  # the release's
    text = config_map["data"]["kvdoctor.json"]
    assert json.loads(text) == B.load()
    assert len(json.dumps(config_map).encode()) < LAST_APPLIED_LIMIT


def test_namespace_annotations_and_labels_as_asked(helm):
    config_map = dashboard_config_map(helm.render("custom-labels"))
    kubernetes_validate.validate(config_map, K8S_VERSION, strict=True)
    assert config_map["metadata"]["namespace"] == "monitoring"
    assert config_map["metadata"]["annotations"] == {"grafana_folder": "LLM serving"}
    assert config_map["metadata"]["labels"]["team"] == "inference"  # commonLabels reach it too


def test_another_sidecar_label(helm):
    rendered = helm.render(None, "--set", f"{SET}.label=example.com/dashboard", "--set-string", f"{SET}.labelValue=yes")
    labels = dashboard_config_map(rendered)["metadata"]["labels"]
    assert labels["example.com/dashboard"] == "yes" and "grafana_dashboard" not in labels


def test_off_by_value(helm):
    assert not helm.render(None, "--set", f"{SET}.enabled=false").all("ConfigMap")
    assert not helm.render("monitoring-off").all("ConfigMap")


@pytest.mark.parametrize(
    "values, says",
    [
        ((f"{SET}.labelValue=not a label",), "labelValue"),
        ((f"{SET}.namespace=Monitoring",), "namespace"),
        ((f"{SET}.labels.grafana_dashboard=other",), "is the sidecar's label"),
    ],
)
def test_bad_values_are_refused_naming_them(helm, values, says):
    args = [a for v in values for a in ("--set", v)]
    assert says in helm.render_error(*args)


def test_packaged_chart_carries_the_dashboard_content(helm, tmp_path):
    helm.run("package", str(helm.chart.path), "--destination", str(tmp_path))
    (package,) = tmp_path.glob("kvdoctor-*.tgz")
    with tarfile.open(package) as tar:
        member = tar.extractfile("kvdoctor/files/grafana-dashboard.json")
        assert member is not None, "helm package left the dashboard out"
        assert member.read().decode() == B.COMMITTED.read_text()
