"""The chart rendered by the real helm: lint, Kubernetes schemas, the alert rules, monitoring,
the restricted Pod Security Standard, and refused values."""

from __future__ import annotations

import json
import tarfile

import kubernetes_validate
import pytest
import yaml

from tests.helm.chart import (
    CHART_DIR,
    CRD_KINDS,
    NAMESPACE,
    RELEASE,
    SCENARIOS,
    arg_value,
    expected_rule_groups,
    prometheus_seconds,
    restricted_violations,
)
from tests.support import tools
from tests.support.processes import run
from tests.support.tools import requires_helm, requires_promtool

pytestmark = requires_helm

K8S_VERSION = "1.30.0"


def scenario_values(name: str) -> dict:
    return yaml.safe_load((CHART_DIR / "ci" / f"{name}-values.yaml").read_text()) or {}


def test_there_is_a_scenario_for_each_documented_install():
    assert {"default", "sidecar-only", "dashboard-off", "monitoring-off", "custom-labels"} <= set(SCENARIOS)


# ------------------------------------------------------------------------------------ lint


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_helm_lint_strict(helm, scenario):
    result = helm.run("lint", "--strict", str(helm.chart.path), "-f", helm.values_file(scenario), check=False)
    assert result.rc == 0, result.stdout + result.stderr
    assert "[WARNING]" not in result.stdout and "[ERROR]" not in result.stdout, result.stdout


# --------------------------------------------------------------------- what each scenario renders

EXPECTED_KINDS = {
    "default": [
        "ConfigMap",
        "Deployment",
        "Deployment",
        "PrometheusRule",
        "Service",
        "Service",
        "Service",
        "ServiceAccount",
        "ServiceMonitor",
    ],
    "sidecar-only": ["ConfigMap", "Deployment", "PodMonitor", "PrometheusRule", "Service", "ServiceAccount"],
    "dashboard-off": [
        "ConfigMap",
        "Deployment",
        "PrometheusRule",
        "Service",
        "Service",
        "ServiceAccount",
        "ServiceMonitor",
    ],
    "monitoring-off": ["Deployment", "Deployment", "Service", "Service", "ServiceAccount"],
    "custom-labels": [
        "ConfigMap",
        "Deployment",
        "Deployment",
        "Ingress",
        "PodMonitor",
        "PrometheusRule",
        "Secret",
        "Service",
        "Service",
        "Service",
        "ServiceAccount",
        "ServiceMonitor",
    ],
}
EXPECTED_KINDS["engine-processes"] = EXPECTED_KINDS["default"]  # only the GPU-visibility wiring differs
EXPECTED_KINDS["alertmanager-config"] = sorted([*EXPECTED_KINDS["default"], "AlertmanagerConfig"])
# web-tls: the Secret is the sidecar's web config.
EXPECTED_KINDS["web-tls"] = [
    "ConfigMap",
    "Deployment",
    "PodMonitor",
    "PrometheusRule",
    "Secret",
    "Service",
    "Service",
    "ServiceAccount",
    "ServiceMonitor",
]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_each_scenario_renders_what_its_values_ask_for(helm, scenario):
    assert helm.render(scenario).kinds() == EXPECTED_KINDS[scenario]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_core_object_passes_the_kubernetes_schema_strictly(helm, scenario):
    checked = 0
    for doc in helm.render(scenario):
        if doc["kind"] in CRD_KINDS:
            continue  # no schema in kubernetes-validate; checked by the tests below
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        checked += 1
    assert checked >= 1


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_names_and_labels_fit_kubernetes_limits(helm, scenario):
    for doc in helm.render(scenario, "--set", "fullnameOverride=" + "x" * 63):
        name = doc["metadata"]["name"]
        assert len(name) <= 63 and not name.endswith("-"), name
        for value in doc["metadata"].get("labels", {}).values():
            assert len(str(value)) <= 63


def test_custom_labels_reach_every_object_and_the_release_selector(helm):
    values = scenario_values("custom-labels")
    rendered = helm.render("custom-labels")
    for doc in rendered:
        assert doc["metadata"]["labels"]["team"] == "inference", doc["kind"]
    for kind in ("ServiceMonitor", "PodMonitor", "PrometheusRule"):
        assert rendered.one(kind)["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert values["commonLabels"] == {"team": "inference"}


# ----------------------------------------------------------------------------- monitoring


@pytest.mark.parametrize("scenario", ["default", "custom-labels", "engine-processes"])
def test_scrape_interval_is_the_exporters_collection_interval(helm, scenario):
    rendered = helm.render(scenario)
    _, sidecar = rendered.container("kvdoctor")
    interval = float(arg_value(sidecar["args"], "--interval"))
    endpoints = [ep for sm in rendered.all("ServiceMonitor") for ep in sm["spec"]["endpoints"]]
    endpoints += [ep for pm in rendered.all("PodMonitor") for ep in pm["spec"]["podMetricsEndpoints"]]
    assert endpoints
    for ep in endpoints:
        assert prometheus_seconds(ep["interval"]) == interval
        if "scrapeTimeout" in ep:
            assert prometheus_seconds(ep["scrapeTimeout"]) <= interval


@pytest.mark.parametrize("interval", [1, 5, 7])
def test_one_value_sets_both_intervals(helm, interval):
    rendered = helm.render("default", "--set", f"sidecar.interval={interval}")
    _, sidecar = rendered.container("kvdoctor")
    assert arg_value(sidecar["args"], "--interval") == str(interval)
    assert rendered.one("ServiceMonitor")["spec"]["endpoints"][0]["interval"] == f"{interval}s"


def test_service_monitor_finds_the_sidecar_through_the_service(helm):
    rendered = helm.render("default")
    service = rendered.one("Service", "exporter")
    monitor = rendered.one("ServiceMonitor")
    pod_labels = rendered.one("Deployment", "engine")["spec"]["template"]["metadata"]["labels"]
    # ServiceMonitor -> Service: its selector matches the Service's labels, its port a Service port.
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == ["kvdoctor-test"]
    # Service -> pod: selects the engine pods, targets the sidecar's named port.
    assert service["spec"]["selector"].items() <= pod_labels.items()
    _, sidecar = rendered.container("kvdoctor")
    port = next(p for p in sidecar["ports"] if p["name"] == service["spec"]["ports"][0]["targetPort"])
    assert port["containerPort"] == int(arg_value(sidecar["args"], "--port"))
    # The engine Service is not the metrics Service: the ServiceMonitor does not select it.
    engine_service = rendered.one("Service", "engine")
    assert not monitor["spec"]["selector"]["matchLabels"].items() <= engine_service["metadata"]["labels"].items()


def test_sidecar_only_pod_monitor_selects_the_users_pods(helm):
    rendered = helm.render("sidecar-only")
    monitor = rendered.one("PodMonitor")
    assert monitor["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": "my-vllm"}
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == "kvdoctor-metrics"
    assert "Deployment" not in [
        d["kind"] for d in rendered if d["metadata"]["labels"].get("app.kubernetes.io/component") == "engine"
    ]


def test_sidecar_only_service_monitor_selects_the_users_pods_through_the_service(helm):
    rendered = helm.render(None, "--set", "engine.enabled=false", "--set", "monitoring.podSelector.app=my-engine")
    assert "engine" not in {d["metadata"]["labels"].get("app.kubernetes.io/component") for d in rendered}
    service = rendered.one("Service", "exporter")
    assert service["spec"]["selector"] == {"app": "my-engine"}
    assert service["spec"]["ports"][0]["targetPort"] == "kvdoctor-metrics"
    assert (
        rendered.one("ServiceMonitor")["spec"]["selector"]["matchLabels"].items()
        <= service["metadata"]["labels"].items()
    )


# ------------------------------------------------------------------------------ alert rules


def rendered_groups(helm, scenario: str) -> list[dict]:
    return helm.render(scenario).one("PrometheusRule")["spec"]["groups"]


def rendered_groups_with(helm, value: str) -> list[dict]:
    """The default scenario's rule groups with ``value`` (a ``--set``) on top."""
    return helm.render("default", "--set", value).one("PrometheusRule")["spec"]["groups"]


def test_chart_reads_rules_alerts_yaml_through_a_symlink(chart):
    link = chart.path / "files" / "alerts.yaml"
    assert (CHART_DIR / "files" / "alerts.yaml").is_symlink(), "the chart must not hold a copy of the rules"
    assert link.resolve() == chart.alerts_file.resolve()


@pytest.mark.parametrize("scenario", ["default", "dashboard-off", "sidecar-only", "engine-processes"])
def test_rules_are_rules_alerts_yaml_unchanged(helm, chart, scenario):
    alerts = yaml.safe_load(chart.alerts_file.read_text())
    assert rendered_groups(helm, scenario) == alerts["groups"]


def test_rules_carry_exactly_the_overrides_asked_for(helm, chart):
    alerts = yaml.safe_load(chart.alerts_file.read_text())
    rule_values = scenario_values("custom-labels")["monitoring"]["prometheusRule"]
    groups = rendered_groups(helm, "custom-labels")
    assert groups == expected_rule_groups(alerts, rule_values, site="https://kvdoctor.example.com")
    by_name = {r["alert"]: r for g in groups for r in g["rules"] if "alert" in r}
    assert "KVCacheTierMiss" not in by_name
    assert by_name["KVCacheThrashing"]["for"] == "10m"
    assert by_name["KVCacheThrashing"]["labels"] == {"severity": "critical", "page": "true", "team": "inference"}
    assert by_name["KvdoctorSourceDown"]["labels"]["severity"] == "info"
    original = {r["alert"]: r for g in alerts["groups"] for r in g["rules"] if "alert" in r}
    for name, rule in by_name.items():
        notes = {k: v for k, v in rule["annotations"].items() if k not in ("runbook_url", "dashboard")}
        assert rule["expr"] == original[name]["expr"] and notes == original[name]["annotations"]


def test_group_intervals_set_only_the_groups_named(helm, chart):
    """The SLO groups' sharding knob: a group named gets that interval, the others keep the file's."""
    alerts = yaml.safe_load(chart.alerts_file.read_text())
    groups = {
        g["name"]: g for g in rendered_groups_with(helm, "monitoring.prometheusRule.groupIntervals.kvdoctor-slo=30s")
    }
    shipped = {g["name"]: g for g in alerts["groups"]}
    assert set(groups) == set(shipped)
    assert groups["kvdoctor-slo"]["interval"] == "30s"
    assert groups["kvdoctor-slo-slow"]["interval"] == shipped["kvdoctor-slo-slow"]["interval"] == "120s"
    assert "interval" not in groups["kvdoctor"]
    assert {k: v for k, v in groups["kvdoctor-slo"].items() if k != "interval"} == shipped["kvdoctor-slo"]


def test_the_schema_names_every_group_the_rule_file_has(chart):
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    rule = schema["properties"]["monitoring"]["properties"]["prometheusRule"]["properties"]
    alerts = yaml.safe_load(chart.alerts_file.read_text())
    assert set(rule["groupIntervals"]["properties"]) == {g["name"] for g in alerts["groups"]}


def test_prometheus_rule_is_not_rendered_when_disabled(helm):
    assert not helm.render("monitoring-off").all("PrometheusRule")


@requires_promtool
@pytest.mark.parametrize("scenario", ["default", "custom-labels"])
def test_rendered_rules_pass_promtool(helm, scenario, tmp_path):
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rendered_groups(helm, scenario)}, sort_keys=False))
    result = run([tools.promtool(), "check", "rules", path])
    assert result.rc == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_packaged_chart_carries_the_rules_file_content(helm, chart, tmp_path):
    helm.run("package", str(chart.path), "--destination", str(tmp_path))
    (package,) = tmp_path.glob("kvdoctor-*.tgz")
    with tarfile.open(package) as tar:
        member = tar.extractfile("kvdoctor/files/alerts.yaml")
        assert member is not None, "helm package left the rules out"
        assert member.read().decode() == chart.alerts_file.read_text()
        assert not any(n.startswith("kvdoctor/ci/") for n in tar.getnames())


# --------------------------------------------------------------------- Pod Security Standards


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_pod_meets_the_restricted_pod_security_standard(helm, scenario):
    pods = helm.render(scenario).pod_specs()
    assert pods
    for name, pod in pods:
        assert restricted_violations(pod) == [], name


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda c, p: c["securityContext"].update(privileged=True), "privileged"),
        (lambda c, p: c["securityContext"].update(allowPrivilegeEscalation=True), "allowPrivilegeEscalation"),
        (lambda c, p: c["securityContext"]["capabilities"].update(drop=[]), "drop ALL"),
        (lambda c, p: c["securityContext"]["capabilities"].update(add=["SYS_ADMIN"]), "adds capabilities"),
        (lambda c, p: c["securityContext"].update(runAsNonRoot=False), "runAsNonRoot"),
        (lambda c, p: c["securityContext"].update(readOnlyRootFilesystem=False), "readOnlyRootFilesystem"),
        (
            lambda c, p: (c["securityContext"].pop("seccompProfile"), p["securityContext"].pop("seccompProfile")),
            "seccompProfile",
        ),
        (lambda c, p: c["resources"].pop("limits"), "no cpu limit"),
        (lambda c, p: p.update(hostNetwork=True), "hostNetwork"),
        (lambda c, p: p["volumes"].append({"name": "h", "hostPath": {"path": "/var/lib/kubelet"}}), "hostPath"),
        (lambda c, p: c.setdefault("ports", []).append({"containerPort": 1, "hostPort": 1}), "hostPort"),
    ],
)
def test_restricted_check_catches_each_violation(helm, mutate, expected):
    pod, sidecar = helm.render("default").container("kvdoctor")
    mutate(sidecar, pod)
    assert any(expected in problem for problem in restricted_violations(pod))


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_kvdoctor_containers_probe_healthz_and_readyz(helm, scenario):
    rendered = helm.render(scenario)
    for _, pod in rendered.pod_specs():
        for c in pod["containers"]:
            if c["name"] == "engine":
                assert c["livenessProbe"]["httpGet"]["path"] == "/health"
                assert c["readinessProbe"]["httpGet"]["path"] == "/health"
                assert c["startupProbe"]["httpGet"]["path"] == "/health"
                continue
            assert c["livenessProbe"]["httpGet"]["path"] == "/healthz", c["name"]
            assert c["readinessProbe"]["httpGet"]["path"] == "/readyz", c["name"]
            names = {p["name"]: p["containerPort"] for p in c["ports"]}
            for probe in ("livenessProbe", "readinessProbe"):
                assert c[probe]["httpGet"]["port"] in names


# ------------------------------------------------------------------------------- the engine


def test_engine_requests_the_gpus_and_the_sidecar_none(helm):
    rendered = helm.render("custom-labels")
    _, engine = rendered.container("engine")
    _, sidecar = rendered.container("kvdoctor")
    assert engine["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert engine["resources"]["requests"]["nvidia.com/gpu"] == 2
    assert "--tensor-parallel-size=2" in engine["args"]
    assert not any("nvidia.com" in k for part in sidecar["resources"].values() for k in part)


def test_cpu_engine_requests_no_gpu(helm):
    _, engine = helm.render("default", "--set", "engine.gpus=0").container("engine")
    assert not any("nvidia.com" in k for part in engine["resources"].values() for k in part)


def test_engine_port_reaches_args_probes_service_and_sidecar(helm):
    rendered = helm.render("default", "--set", "engine.port=8123")
    _, engine = rendered.container("engine")
    _, sidecar = rendered.container("kvdoctor")
    assert "--port=8123" in engine["args"]
    assert engine["ports"][0]["containerPort"] == 8123
    assert arg_value(sidecar["args"], "--engine-url") == "http://127.0.0.1:8123/metrics"


# ------------------------------------------------------------------------------ the dashboard


def test_dashboard_runs_against_prometheus_with_users_from_a_secret(helm):
    rendered = helm.render("custom-labels")
    pod, dash = rendered.container("dashboard")
    assert dash["command"] == ["kvdoctor", "dashboard"]
    assert arg_value(dash["args"], "--prometheus") == "http://prometheus-operated.monitoring.svc:9090"
    assert arg_value(dash["args"], "--host") == "0.0.0.0"
    assert arg_value(dash["args"], "--port") == "8050"
    env = {e["name"]: e.get("value") for e in dash["env"]}
    auth_file = env["KVDOCTOR_DASHBOARD_AUTH_FILE"]
    mount = next(m for m in dash["volumeMounts"] if auth_file.startswith(m["mountPath"] + "/"))
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    secret = rendered.one("Secret")
    assert volume["secret"]["secretName"] == secret["metadata"]["name"]
    item = volume["secret"]["items"][0]
    assert auth_file == f"{mount['mountPath']}/{item['path']}"
    import base64

    assert base64.b64decode(secret["data"][item["key"]]).decode() == "oncall:not-a-real-password\n"
    ingress = rendered.one("Ingress")
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend["name"] == rendered.one("Service", "dashboard")["metadata"]["name"]


def test_dashboard_with_an_existing_secret_creates_none(helm):
    rendered = helm.render("sidecar-only")
    pod, _ = rendered.container("dashboard")
    assert not rendered.all("Secret")
    assert [v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v] == ["kvdoctor-dashboard-users"]


def test_dashboard_without_users_has_no_auth_file(helm):
    _, dash = helm.render("default").container("dashboard")
    assert "KVDOCTOR_DASHBOARD_AUTH_FILE" not in {e["name"] for e in dash["env"]}


def test_notes_say_how_to_open_the_dashboard_and_check_the_sidecar(helm):
    result = helm.run(
        "install", RELEASE, str(helm.chart.path), "--dry-run=client", "--namespace", NAMESPACE, "-f", helm.values_file()
    )
    notes = result.stdout.split("NOTES:", 1)[1]
    assert "kubectl port-forward -n kvdoctor-test svc/kvt-kvdoctor-dashboard 8050:8050" in notes
    assert "curl -s http://127.0.0.1:9745/metrics" in notes
    assert "app.kubernetes.io/component=engine" in notes


# ---------------------------------------------------------------------------- refused values


@pytest.mark.parametrize(
    "values, where, says",
    [
        (("--set", "foo=1"), "at ''", "'foo' not allowed"),
        (("--set", "sidecar.intervall=5"), "/sidecar", "'intervall' not allowed"),
        (("--set", "sidecar.port=-1"), "/sidecar/port", "minimum"),
        (("--set", "engine.port=70000"), "/engine/port", "maximum"),
        (("--set", "sidecar.interval=abc"), "/sidecar/interval", "want integer"),
        (("--set", "sidecar.interval=2.5"), "/sidecar/interval", "want integer"),
        (("--set", "sidecar.interval=30"), "/sidecar/interval", "maximum"),
        (("--set", "dashboard.enabled=yes"), "/dashboard/enabled", "want boolean"),
        (("--set", "sidecar.gpuVisibility.mode=nvml"), "/sidecar/gpuVisibility/mode", "engineFile"),
        (
            ("--set-json", 'monitoring.prometheusRule.alerts={"KVCacheThrash":{"enabled":false}}'),
            "/monitoring/prometheusRule/alerts",
            "'KVCacheThrash' not allowed",
        ),
        (
            ("--set", "monitoring.prometheusRule.alerts.KVCacheThrashing.for=ten minutes"),
            "/monitoring/prometheusRule/alerts/KVCacheThrashing/for",
            "ten minutes",
        ),
        (
            ("--set", "monitoring.prometheusRule.alerts.KVCacheThrashing.severity=page"),
            "/monitoring/prometheusRule/alerts/KVCacheThrashing/severity",
            "critical",
        ),
        (("--set", "image.pullPolicy=Sometimes"), "/image/pullPolicy", "IfNotPresent"),
        (("--set-json", 'dashboard.auth.users=["no-password"]'), "/dashboard/auth/users/0", "no-password"),
    ],
)
def test_schema_refuses_bad_values_with_a_clear_message(helm, values, where, says):
    message = helm.render_error(*values)
    assert "values don't meet the specifications of the schema" in message
    assert where in message and says in message, message


@pytest.mark.parametrize(
    "values, says",
    [
        (("--set", "engine.enabled=false"), "monitoring.podSelector: with engine.enabled=false"),
        (
            ("--set", "monitoring.service.enabled=false"),
            "monitoring.serviceMonitor.enabled needs monitoring.service.enabled",
        ),
        (("--set", "dashboard.ingress.enabled=true"), "refusing to expose the dashboard without basic-auth users"),
        (("--set", "dashboard.prometheusUrl="), "dashboard.prometheusUrl: the dashboard needs the URL"),
        (("--set", "sidecar.gpuVisibility.mode=uuids"), "mode uuids needs at least one GPU UUID"),
    ],
)
def test_inconsistent_values_fail_with_the_values_name(helm, values, says):
    message = helm.render_error(*values)
    assert says in message, message
    assert "\n\t" not in message.strip()  # one line, no template stack dump


def test_anonymous_ingress_when_asked_for_explicitly(helm):
    rendered = helm.render(
        "default", "--set", "dashboard.ingress.enabled=true", "--set", "dashboard.ingress.allowAnonymous=true"
    )
    assert rendered.one("Ingress")
