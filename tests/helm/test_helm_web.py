"""sidecar.web: the chart's TLS and basic-auth wiring. The web config it renders is what the real
exporter reads (started with the rendered arguments, its probes and the monitors' credentials
tried against it); the probes and the ServiceMonitor/PodMonitor follow TLS, client certificates
and basic auth; what cannot work fails with the value's name. Also: the default image references
are the ones scripts/build-image.sh builds."""

from __future__ import annotations

import subprocess

import bcrypt
import httpx
import pytest
import yaml

from kvdoctor.exporter.web_config import load_web_config
from tests.helm.chart import ROOT, rendered_command, replaced
from tests.support import tools
from tests.support.certificates import make_pki
from tests.support.servers import respond
from tests.support.tools import requires_helm

pytestmark = requires_helm

PASSWORD = "scrape-me"
HASH = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
MTLS = ("--set", "sidecar.web.tls.clientAuthType=RequireAndVerifyClientCert")
CLIENT_CERT = (
    "--set",
    "monitoring.scrapeClient.tlsConfig.cert.secret.name=prom-client,monitoring.scrapeClient.tlsConfig.cert.secret.key=tls.crt",
    "--set",
    "monitoring.scrapeClient.tlsConfig.keySecret.name=prom-client,monitoring.scrapeClient.tlsConfig.keySecret.key=tls.key",
)
FIXTURE = ROOT / "tests" / "fixtures" / "vllm-0.32-cpu" / "idle.txt"


def web_config(rendered) -> dict:
    (secret,) = [s for s in rendered.all("Secret") if s["metadata"]["name"].endswith("-web-config")]
    return yaml.safe_load(secret["stringData"]["web-config.yml"])


def endpoints(rendered) -> list[dict]:
    service = rendered.one("ServiceMonitor")["spec"]["endpoints"]
    pod = rendered.one("PodMonitor")["spec"]["podMetricsEndpoints"]
    return service + pod


# ---------------------------------------------------------------------------- the real exporter


@pytest.mark.slow
def test_the_rendered_web_config_secures_the_real_exporter_and_the_probes_still_pass(
    helm, fake_server, spawn, tmp_path
):
    rendered = helm.render("web-tls", "--set-string", f"sidecar.web.basicAuthUsers.prometheus={HASH}")
    pod, sidecar = rendered.container("kvdoctor")
    mounts = {m["name"]: m["mountPath"] for m in sidecar["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["kvdoctor-tls"]["secret"]["secretName"] == "kvdoctor-tls"
    # The TLS Secret's files (tls.crt, tls.key, ca.crt), where the rendered config expects them.
    pki = make_pki(tmp_path / "pki")
    tls_dir = tmp_path / "tls"
    tls_dir.mkdir()
    for name, source in (("tls.crt", pki.server_cert), ("tls.key", pki.server_key), ("ca.crt", pki.ca)):
        (tls_dir / name).write_bytes(source.read_bytes())
    config = web_config(rendered)
    text = yaml.safe_dump(config).replace(mounts["kvdoctor-tls"], str(tls_dir))
    config_file = tmp_path / "web-config.yml"
    config_file.write_text(text)
    assert load_web_config(config_file).users == {"prometheus": HASH.encode()}

    engine = fake_server({"/metrics": respond(FIXTURE.read_bytes())}).url("/metrics")
    port = tools.free_port()
    argv = replaced(sidecar["command"] + sidecar["args"], port=port, engine_url=engine)
    flag = "--web.config.file=/etc/kvdoctor/web/web-config.yml"
    assert argv.count(flag) == 1 and mounts["kvdoctor-web"] == "/etc/kvdoctor/web"
    argv[argv.index(flag)] = f"--web.config.file={config_file}"
    exporter = spawn(rendered_command(argv, {"KVDOCTOR_POD": "p"}, tmp_path))
    exporter.wait_for_line(r"serving https://")
    with httpx.Client(verify=pki.client_context(), timeout=5) as https:
        for probe in ("livenessProbe", "readinessProbe"):
            get = sidecar[probe]["httpGet"]
            url = f"{get['scheme'].lower()}://127.0.0.1:{port}{get['path']}"
            exporter.wait_for(lambda url=url: https.get(url).status_code == 200, timeout=60, what=f"{probe} passing")
        for endpoint in endpoints(rendered):
            assert endpoint["scheme"] == "https" and endpoint["basicAuth"]["password"]["name"] == "kvdoctor-scrape"
            url = f"https://127.0.0.1:{port}{endpoint['path']}"
            assert https.get(url).status_code == 401
            assert https.get(url, auth=("prometheus", PASSWORD)).status_code == 200


# ------------------------------------------------------------------------------- what renders


def test_web_off_renders_no_secret_no_flag_and_plain_http(helm):
    rendered = helm.render("default")
    _, sidecar = rendered.container("kvdoctor")
    assert not any(arg.startswith("--web.config.file") for arg in sidecar["args"])
    assert "scheme" not in sidecar["livenessProbe"]["httpGet"]
    assert not [s for s in rendered.all("Secret") if s["metadata"]["name"].endswith("-web-config")]
    (endpoint,) = rendered.one("ServiceMonitor")["spec"]["endpoints"]
    assert not {"scheme", "tlsConfig", "basicAuth"} & set(endpoint)


def test_tls_makes_the_probes_and_the_monitors_https_and_trust_the_secrets_ca(helm):
    rendered = helm.render("web-tls")
    _, sidecar = rendered.container("kvdoctor")
    assert "--web.config.file=/etc/kvdoctor/web/web-config.yml" in sidecar["args"]
    for probe in ("livenessProbe", "readinessProbe"):
        assert sidecar[probe]["httpGet"]["scheme"] == "HTTPS"
    config = web_config(rendered)
    assert config["tls_server_config"]["cert_file"] == "/etc/kvdoctor/tls/tls.crt"
    assert "client_ca_file" not in config["tls_server_config"]
    for endpoint in endpoints(rendered):
        assert endpoint["tlsConfig"] == {
            "ca": {"secret": {"name": "kvdoctor-tls", "key": "ca.crt"}},
            "serverName": "kvt-kvdoctor-metrics.kvdoctor-test.svc",
        }
    metrics_service = [s for s in rendered.all("Service") if s["metadata"]["name"] == "kvt-kvdoctor-metrics"]
    assert metrics_service, "the serverName names the metrics Service"


def test_required_client_certificates_turn_the_probes_into_tcp_checks(helm):
    rendered = helm.render("web-tls", *MTLS, *CLIENT_CERT)
    _, sidecar = rendered.container("kvdoctor")
    for probe in ("livenessProbe", "readinessProbe"):
        assert sidecar[probe] == {**sidecar[probe], "tcpSocket": {"port": "kvdoctor-metrics"}}
        assert "httpGet" not in sidecar[probe]
    tls = web_config(rendered)["tls_server_config"]
    assert (tls["client_auth_type"], tls["client_ca_file"]) == (
        "RequireAndVerifyClientCert",
        "/etc/kvdoctor/tls/ca.crt",
    )
    for endpoint in endpoints(rendered):
        assert endpoint["tlsConfig"]["cert"] == {"secret": {"name": "prom-client", "key": "tls.crt"}}


def test_an_existing_web_config_secret_replaces_the_charts(helm):
    rendered = helm.render("web-tls", "--set", "sidecar.web.existingSecret=my-web-config")
    pod, _ = rendered.container("kvdoctor")
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["kvdoctor-web"]["secret"]["secretName"] == "my-web-config"
    assert not [s for s in rendered.all("Secret") if s["metadata"]["name"].endswith("-web-config")]
    deployment = rendered.one("Deployment", "engine")
    assert "checksum/web-config" not in (deployment["spec"]["template"]["metadata"].get("annotations") or {})


def test_a_changed_user_list_restarts_the_pods(helm):
    def checksum(*values):
        deployment = helm.render("web-tls", *values).one("Deployment", "engine")
        return deployment["spec"]["template"]["metadata"]["annotations"]["checksum/web-config"]

    assert checksum() != checksum("--set-string", f"sidecar.web.basicAuthUsers.oncall={HASH}")


@pytest.mark.parametrize(
    "scenario, values, says",
    [
        ("default", ("--set", "sidecar.web.tls.enabled=true"), "sidecar.web.tls.secretName"),
        ("web-tls", ("--set", "sidecar.web.tls.secretName="), "sidecar.web.tls.secretName"),
        (
            "web-tls",
            ("--set", "sidecar.web.tls.secretName=,sidecar.web.existingSecret=own"),  # no CA to default to
            "monitoring.scrapeClient.tlsConfig",
        ),
        ("web-tls", MTLS, "needs Prometheus's client certificate"),
        ("web-tls", ("--set", "monitoring.scrapeClient.basicAuth=null"), "monitoring.scrapeClient.basicAuth"),
    ],
)
def test_what_cannot_work_fails_naming_the_value(helm, scenario, values, says):
    assert says in helm.render_error(*values, scenario=scenario)


def test_the_schema_refuses_a_password_where_a_bcrypt_hash_belongs(helm):
    error = helm.render_error("--set", "sidecar.web.basicAuthUsers.prometheus=hunter2")
    assert "basicAuthUsers" in error and "does not match" in error


# ------------------------------------------------------------------------------------ images


def test_default_images_are_what_the_build_script_builds(helm):
    built = dict(
        line.split(" ", 1)
        for line in subprocess.run(
            ["bash", str(ROOT / "scripts/build-image.sh"), "--print-refs"],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout.split("\n")
        if line
    )
    rendered = helm.render("default")
    assert rendered.container("kvdoctor")[1]["image"] == built["sidecar"]
    assert rendered.container("dashboard")[1]["image"] == built["dashboard"]
