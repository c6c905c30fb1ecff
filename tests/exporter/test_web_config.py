"""``--web.config.file``: the exporter-toolkit format read and checked (exporter/web_config.py), and
a bad file as one line and exit status 2 from the real command."""

from __future__ import annotations

import ssl
from pathlib import Path

import bcrypt
import pytest
import yaml

from kvdoctor.exporter.web_config import WebConfigError, load_web_config, parse_duration
from tests.support.certificates import PKI, make_pki
from tests.support.errors import one_line_error

HASH = bcrypt.hashpw(b"secret", bcrypt.gensalt(rounds=4)).decode()
TLS = "tls_server_config: {cert_file: server.crt, key_file: server.key, "  # + the rest of the mapping


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> PKI:
    return make_pki(tmp_path_factory.mktemp("pki"))


def write(folder: Path, text: str, name: str = "web.yml") -> Path:
    path = folder / name
    path.write_text(text)
    return path


def test_the_node_exporter_style_file_is_read_with_paths_relative_to_it(pki):
    path = write(
        pki.folder,
        f"""
tls_server_config:
  cert_file: server.crt
  key_file: server.key
  client_auth_type: RequireAndVerifyClientCert
  client_ca_file: {pki.ca.name}
  client_allowed_sans: [prometheus.kvdoctor.test]
  min_version: TLS13
  cipher_suites: [TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, TLS_AES_128_GCM_SHA256]
  curve_preferences: [X25519]
http_server_config:
  http2: false
  headers:
    X-Frame-Options: deny
    Strict-Transport-Security: max-age=31536000
basic_auth_users:
  prometheus: '{HASH}'
rate_limit:
  interval: 1m30s
  burst: 5
""",
    )
    config = load_web_config(path)
    assert config.tls.cert_file == pki.server_cert and config.tls.client_ca_file == pki.ca
    assert config.tls.client_auth_type == "RequireAndVerifyClientCert"
    assert config.tls.client_allowed_sans == ("prometheus.kvdoctor.test",)
    assert config.tls.min_version is ssl.TLSVersion.TLSv1_3
    assert config.tls.ciphers == ("ECDHE-ECDSA-AES128-GCM-SHA256",)  # the TLS 1.3 suite is not configurable
    assert config.users == {"prometheus": HASH.encode()}
    assert config.headers == (("X-Frame-Options", "deny"), ("Strict-Transport-Security", "max-age=31536000"))
    assert not config.http2
    assert (config.rate_limit.interval, config.rate_limit.burst) == (90.0, 5)
    context = config.tls.context()
    assert context.verify_mode == ssl.CERT_REQUIRED and context.minimum_version is ssl.TLSVersion.TLSv1_3


def test_inline_pem_is_accepted_like_files(pki):
    inline = {"tls_server_config": {"cert": pki.server_cert.read_text(), "key": pki.server_key.read_text()}}
    path = write(pki.folder, yaml.safe_dump(inline), "inline.yml")
    assert load_web_config(path).tls.context().verify_mode == ssl.CERT_NONE


def test_an_empty_file_or_no_tls_setting_means_plain_http(tmp_path):
    assert load_web_config(write(tmp_path, "")).tls is None
    assert load_web_config(write(tmp_path, f"tls_server_config: {{}}\nbasic_auth_users: {{u: '{HASH}'}}\n")).tls is None


@pytest.mark.parametrize(
    "text, message",
    [
        ("tls_server_config: {cert_file: server.crt, key_file: server.key}\nbogus: 1\n", "unknown key bogus"),
        (
            TLS + "client_auth: x}\n",
            "unknown key tls_server_config.client_auth",
        ),
        ("basic_auth_users: {prom: secret}\n", "basic_auth_users.prom: not a bcrypt hash"),
        ("tls_server_config: {cert_file: server.crt}\n", "missing one of key or key_file"),
        ("tls_server_config: {key_file: server.key}\n", "missing one of cert or cert_file"),
        ("tls_server_config: {cert_file: server.crt, key_file: nope.key}\n", "cannot load the certificate and key"),
        ("tls_server_config: {cert_file: server.crt, key_file: client.key}\n", "cannot load the certificate and key"),
        (
            TLS + "client_ca_file: kvdoctor-test-ca.crt}\n",
            "client_ca_file is set but client_auth_type is NoClientCert",
        ),
        (
            TLS + "client_auth_type: RequireAndVerifyClientCert}\n",
            "needs client_ca_file",
        ),
        (
            TLS + "client_auth_type: RequireAnyClientCert}\n",
            "RequireAnyClientCert (a certificate asked for but not verified) is not supported",
        ),
        (
            TLS + "client_auth_type: Always}\n",
            "unknown 'Always'",
        ),
        (
            TLS + "min_version: TLS13, max_version: TLS12}\n",
            "min_version is above max_version",
        ),
        (
            TLS + "cipher_suites: [RC4]}\n",
            "unknown cipher 'RC4'",
        ),
        (
            TLS + "curve_preferences: [X25519, CurveP256]}\n",
            "one curve, not a preference list",
        ),
        ("http_server_config: {headers: {Server: kvdoctor}}\n", "header 'Server' can not be configured"),
        ("http_server_config: {headers: {X-Frame-Options: allow}}\n", "expected one of deny, sameorigin"),
        ("http_server_config: {http2: maybe}\n", "http_server_config.http2: expected true or false"),
        ("rate_limit: {interval: fast, burst: 1}\n", "rate_limit.interval: expected a duration"),
        ("rate_limit: {interval: 1s, burst: 0}\n", "rate_limit.burst: must be at least 1"),
        ("tls_server_config: [a]\n", "tls_server_config: expected a mapping"),
        ("basic_auth_users:\n  prom: '$2y$10$short'\n", "not a bcrypt hash"),
        ("a: [\n", "not YAML at line"),
    ],
)
def test_a_bad_file_is_one_line_naming_the_file_and_the_key(pki, text, message):
    path = write(pki.folder, text, "bad.yml")
    said = one_line_error(WebConfigError, load_web_config, path)
    assert message in said and said.startswith(f"web config {str(path)!r}: ")


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(WebConfigError, match=r"no such file"):
        load_web_config(tmp_path / "absent.yml")


@pytest.mark.parametrize(
    "text, seconds",
    [("0", 0.0), (0, 0.0), ("1s", 1.0), ("100ms", 0.1), ("1m30s", 90.0), ("1.5h", 5400.0), ("250us", 0.00025)],
)
def test_go_durations(text, seconds):
    assert parse_duration(text, "x") == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "1", "s", "1d", "1s2", "-1s", 1.5])
def test_bad_durations(text):
    with pytest.raises(WebConfigError):
        parse_duration(text, "x")


@pytest.mark.parametrize("how", ["flag", "env"])
def test_the_command_exits_2_with_one_line_for_a_bad_web_config(run_cli, tmp_path, how):
    path = write(tmp_path, "basic_auth_users: {prom: plaintext}\n")
    args, env = ("exporter", "--port", "0", "--no-collector.nvml"), {}
    if how == "flag":
        args += ("--web.config.file", str(path))
    else:
        env["KVDOCTOR_WEB_CONFIG_FILE"] = str(path)
    rc, out, err = run_cli(*args, env=env, clean_env=True, timeout=60)
    assert rc == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "--web.config.file (KVDOCTOR_WEB_CONFIG_FILE)" in lines[0]
    assert "basic_auth_users.prom: not a bcrypt hash" in lines[0]
