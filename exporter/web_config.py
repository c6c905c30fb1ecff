"""``--web.config.file``: the Prometheus exporter-toolkit web configuration (TLS, basic auth).

The same YAML file node_exporter and the other exporter-toolkit exporters read
(https://github.com/prometheus/exporter-toolkit/blob/master/docs/web-configuration.md)::

    tls_server_config:
      cert_file: server.crt            # or cert: <PEM>; relative paths are relative to this file
      key_file: server.key             # or key: <PEM>
      client_auth_type: RequireAndVerifyClientCert
      client_ca_file: ca.crt           # or client_ca: <PEM>
      client_allowed_sans: [prometheus.monitoring.svc]
      min_version: TLS12               # TLS10 .. TLS13
      max_version: TLS13
      cipher_suites: [TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256]   # Go's names; TLS 1.2 and below
      prefer_server_cipher_suites: true
      curve_preferences: [X25519]      # one curve (Python's ssl sets one, not a preference list)
    http_server_config:
      http2: true                      # accepted; kvdoctor serves HTTP/1.1
      headers: {X-Content-Type-Options: nosniff}
    basic_auth_users:
      prometheus: $2y$10$...           # bcrypt hashes (htpasswd -nBC 10 "" | tr -d ':\\n')
    rate_limit: {interval: 100ms, burst: 20}

``load_web_config(path)`` reads and checks the whole file, certificates included, and raises
``WebConfigError`` with one line naming the file and the key; ``web_guard.py`` enforces it. The
client authentication types that ask for a certificate without verifying it (RequestClientCert,
RequireAnyClientCert) cannot be expressed with Python's ``ssl`` module and are refused by name.
"""

from __future__ import annotations

import contextlib
import os
import re
import ssl
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
# client_auth_type -> ssl verify mode; the two that request a certificate without verifying it
# have no equivalent in Python's ssl module.
CLIENT_AUTH = {"NoClientCert": ssl.CERT_NONE, "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL}
CLIENT_AUTH["RequireAndVerifyClientCert"] = ssl.CERT_REQUIRED
UNSUPPORTED_CLIENT_AUTH = ("RequestClientCert", "RequireAnyClientCert", "RequireClientCert")
# Go's cipher suite names (tls.CipherSuites()) -> OpenSSL's. TLS 1.3 suites are not configurable
# in Go either: they are accepted and left to the TLS library.
CIPHER_SUITES = {
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_AES_128_GCM_SHA256": None,
    "TLS_AES_256_GCM_SHA384": None,
    "TLS_CHACHA20_POLY1305_SHA256": None,
}
CURVES = {"CurveP256": "prime256v1", "CurveP384": "secp384r1", "CurveP521": "secp521r1", "X25519": "X25519"}
# The response headers exporter-toolkit lets a file set, with their allowed values (None: any).
HEADERS: dict[str, tuple[str, ...] | None] = {
    "Strict-Transport-Security": None,
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": None,
    "Content-Security-Policy": None,
}
_TOP_KEYS = ("tls_server_config", "http_server_config", "basic_auth_users", "rate_limit")
_TLS_KEYS = (
    "cert",
    "key",
    "client_ca",
    "cert_file",
    "key_file",
    "client_auth_type",
    "client_ca_file",
    "client_allowed_sans",
    "min_version",
    "max_version",
    "cipher_suites",
    "prefer_server_cipher_suites",
    "curve_preferences",
)
_BCRYPT = re.compile(r"^\$2[abxy]?\$(\d\d)\$[./A-Za-z0-9]{53}$")
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


class WebConfigError(ValueError):
    """The web configuration file cannot be used; the message is one line."""


@dataclass(frozen=True)
class TLSServerConfig:
    """``tls_server_config``: where the certificates are and how clients are checked."""

    cert_file: Path | None = None
    key_file: Path | None = None
    cert: str | None = None
    key: str | None = None
    client_ca_file: Path | None = None
    client_ca: str | None = None
    client_auth_type: str = "NoClientCert"
    client_allowed_sans: tuple[str, ...] = ()
    min_version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_2
    max_version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_3
    ciphers: tuple[str, ...] = ()  # OpenSSL names
    prefer_server_cipher_suites: bool = True
    curve: str | None = None  # OpenSSL name

    @property
    def files(self) -> tuple[Path, ...]:
        """The files the context is made from (watched for rotation)."""
        return tuple(p for p in (self.cert_file, self.key_file, self.client_ca_file) if p is not None)

    def context(self) -> ssl.SSLContext:
        """A server SSLContext from the current files; WebConfigError if they cannot be loaded."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version, ctx.maximum_version = self.min_version, self.max_version
        try:
            with _pem_path(self.cert_file, self.cert) as cert, _pem_path(self.key_file, self.key) as key:
                ctx.load_cert_chain(cert, key)
        except (OSError, ssl.SSLError) as exc:
            raise WebConfigError(f"cannot load the certificate and key: {_reason(exc)}") from None
        mode = CLIENT_AUTH[self.client_auth_type]
        if mode != ssl.CERT_NONE:
            try:
                if self.client_ca_file is not None:
                    ctx.load_verify_locations(cafile=str(self.client_ca_file))
                else:
                    ctx.load_verify_locations(cadata=self.client_ca)
            except (OSError, ssl.SSLError, ValueError) as exc:
                raise WebConfigError(f"cannot load the client CA: {_reason(exc)}") from None
            ctx.verify_mode = mode
        if self.ciphers:
            try:
                ctx.set_ciphers(":".join(self.ciphers))
            except ssl.SSLError:
                raise WebConfigError("none of cipher_suites is available in this TLS library") from None
        if self.prefer_server_cipher_suites:
            ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
        if self.curve is not None:
            ctx.set_ecdh_curve(self.curve)
        return ctx


@dataclass(frozen=True)
class RateLimit:
    """``rate_limit``: a token bucket, one token per ``interval`` seconds, ``burst`` at most."""

    interval: float
    burst: int


@dataclass(frozen=True)
class WebConfig:
    """The whole file, checked."""

    path: Path
    tls: TLSServerConfig | None = None
    users: Mapping[str, bytes] = field(default_factory=dict)  # user -> bcrypt hash
    headers: tuple[tuple[str, str], ...] = ()
    http2: bool = True
    rate_limit: RateLimit | None = None

    def describe(self) -> str:
        """One line for the start-up log: what is enforced."""
        tls = "TLS off"
        if self.tls is not None:
            tls = f"TLS on (client certificates: {self.tls.client_auth_type})"
        auth = f"basic auth for {len(self.users)} user(s)" if self.users else "no basic auth"
        return f"{tls}, {auth}" + (f", rate limit {self.rate_limit.burst} burst" if self.rate_limit else "")


def load_web_config(path: str | os.PathLike[str]) -> WebConfig:
    """Read and check ``path`` (certificates loaded once); WebConfigError naming the file and the key."""
    file = Path(path).expanduser()
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise WebConfigError(f"web config {str(path)!r}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise WebConfigError(f"web config {str(path)!r}: cannot read it ({_reason(exc)})") from None
    try:
        return _parse(file, text)
    except WebConfigError as exc:
        raise WebConfigError(f"web config {str(path)!r}: {exc}") from None


def _parse(file: Path, text: str) -> WebConfig:
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise WebConfigError(f"not YAML{where}") from None
    top = _mapping(raw if raw is not None else {}, "the file", _TOP_KEYS)
    base = file.parent
    tls = _tls(_mapping(top.get("tls_server_config") or {}, "tls_server_config", _TLS_KEYS), base)
    http = _mapping(top.get("http_server_config") or {}, "http_server_config", ("http2", "headers"))
    config = WebConfig(
        path=file,
        tls=tls,
        users=_users(top.get("basic_auth_users")),
        headers=_headers(http.get("headers")),
        http2=_bool(http.get("http2", True), "http_server_config.http2"),
        rate_limit=_rate_limit(top.get("rate_limit")),
    )
    if tls is not None:
        tls.context()  # a certificate that does not load fails now, not at the first scrape
    return config


def _tls(raw: Mapping[str, Any], base: Path) -> TLSServerConfig | None:
    def text(key: str) -> str | None:
        value = raw.get(key)
        if value is None or value == "":
            return None
        if not isinstance(value, str):
            raise WebConfigError(f"tls_server_config.{key}: expected a string")
        return value

    def path(key: str) -> Path | None:
        value = text(key)
        return None if value is None else base / Path(value).expanduser()

    enabled = ("cert", "key", "client_ca", "cert_file", "key_file", "client_ca_file", "client_auth_type")
    if not any(text(k) for k in enabled):
        return None  # exporter-toolkit: no TLS setting at all means plain HTTP
    for inline, named in (("cert", "cert_file"), ("key", "key_file"), ("client_ca", "client_ca_file")):
        if text(inline) and text(named):
            raise WebConfigError(f"tls_server_config: give {inline} or {named}, not both")
    if not (text("cert") or text("cert_file")):
        raise WebConfigError("tls_server_config: missing one of cert or cert_file")
    if not (text("key") or text("key_file")):
        raise WebConfigError("tls_server_config: missing one of key or key_file")
    auth = text("client_auth_type") or "NoClientCert"
    if auth in UNSUPPORTED_CLIENT_AUTH:
        raise WebConfigError(
            f"tls_server_config.client_auth_type: {auth} (a certificate asked for but not verified) is not "
            "supported; use RequireAndVerifyClientCert or VerifyClientCertIfGiven with client_ca_file"
        )
    if auth not in CLIENT_AUTH:
        raise WebConfigError(f"tls_server_config.client_auth_type: unknown {auth!r} (one of {', '.join(CLIENT_AUTH)})")
    has_ca = bool(text("client_ca") or text("client_ca_file"))
    if has_ca and auth == "NoClientCert":
        raise WebConfigError("tls_server_config: client_ca_file is set but client_auth_type is NoClientCert")
    if not has_ca and auth != "NoClientCert":
        raise WebConfigError(f"tls_server_config: client_auth_type {auth} needs client_ca_file (or client_ca)")
    sans = _strings(raw.get("client_allowed_sans"), "tls_server_config.client_allowed_sans")
    if sans and auth != "RequireAndVerifyClientCert":
        raise WebConfigError("tls_server_config.client_allowed_sans needs client_auth_type RequireAndVerifyClientCert")
    versions = {}
    for key, default in (("min_version", "TLS12"), ("max_version", "TLS13")):
        name = text(key) or default
        if name not in TLS_VERSIONS:
            raise WebConfigError(f"tls_server_config.{key}: unknown {name!r} (one of {', '.join(TLS_VERSIONS)})")
        versions[key] = TLS_VERSIONS[name]
    if versions["min_version"] > versions["max_version"]:
        raise WebConfigError("tls_server_config: min_version is above max_version")
    ciphers = []
    for name in _strings(raw.get("cipher_suites"), "tls_server_config.cipher_suites"):
        if name not in CIPHER_SUITES:
            raise WebConfigError(f"tls_server_config.cipher_suites: unknown cipher {name!r}")
        if CIPHER_SUITES[name] is not None:
            ciphers.append(str(CIPHER_SUITES[name]))
    curves = _strings(raw.get("curve_preferences"), "tls_server_config.curve_preferences")
    for name in curves:
        if name not in CURVES:
            raise WebConfigError(f"tls_server_config.curve_preferences: unknown curve {name!r}")
    if len(curves) > 1:
        raise WebConfigError("tls_server_config.curve_preferences: kvdoctor can set one curve, not a preference list")
    return TLSServerConfig(
        cert_file=path("cert_file"),
        key_file=path("key_file"),
        cert=text("cert"),
        key=text("key"),
        client_ca_file=path("client_ca_file"),
        client_ca=text("client_ca"),
        client_auth_type=auth,
        client_allowed_sans=sans,
        min_version=versions["min_version"],
        max_version=versions["max_version"],
        ciphers=tuple(ciphers),
        prefer_server_cipher_suites=_bool(
            raw.get("prefer_server_cipher_suites", True), "tls_server_config.prefer_server_cipher_suites"
        ),
        curve=CURVES[curves[0]] if curves else None,
    )


def _users(raw: Any) -> dict[str, bytes]:
    users: dict[str, bytes] = {}
    for user, hashed in _mapping(raw or {}, "basic_auth_users", None).items():
        if not isinstance(hashed, str) or not _BCRYPT.match(hashed):
            raise WebConfigError(f'basic_auth_users.{user}: not a bcrypt hash (make one with htpasswd -nBC 10 "")')
        users[str(user)] = hashed.encode("ascii")
    return users


def _headers(raw: Any) -> tuple[tuple[str, str], ...]:
    headers = []
    for name, value in _mapping(raw or {}, "http_server_config.headers", None).items():
        if name not in HEADERS:
            raise WebConfigError(f"http_server_config.headers: header {name!r} can not be configured")
        if not isinstance(value, str) or "\r" in value or "\n" in value:
            raise WebConfigError(f"http_server_config.headers.{name}: expected a one-line string")
        allowed = HEADERS[name]
        if value and allowed is not None and value not in allowed:
            raise WebConfigError(f"http_server_config.headers.{name}: expected one of {', '.join(allowed)}")
        if value:
            headers.append((str(name), value))
    return tuple(headers)


def _rate_limit(raw: Any) -> RateLimit | None:
    if raw is None:
        return None
    values = _mapping(raw, "rate_limit", ("interval", "burst"))
    interval = parse_duration(values.get("interval", 0), "rate_limit.interval")
    burst = values.get("burst", 0)
    if isinstance(burst, bool) or not isinstance(burst, int) or burst < 0:
        raise WebConfigError("rate_limit.burst: expected a whole number >= 0")
    if interval == 0:
        return None  # exporter-toolkit: an interval of 0 turns the limiter off
    if burst < 1:
        raise WebConfigError("rate_limit.burst: must be at least 1 when an interval is set (0 refuses every request)")
    return RateLimit(interval, burst)


def parse_duration(value: Any, where: str) -> float:
    """A Go duration (``1s``, ``100ms``, ``1m30s``, ``0``) in seconds."""
    if value == 0 or value == "0":
        return 0.0
    text = value if isinstance(value, str) else ""
    parts = _DURATION_PART.findall(text)
    if not text or "".join(n + u for n, u in parts) != text:
        raise WebConfigError(f"{where}: expected a duration such as 1s or 100ms, got {value!r}")
    return sum(float(number) * _DURATION_UNITS[unit] for number, unit in parts)


def _mapping(raw: Any, where: str, keys: tuple[str, ...] | None) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise WebConfigError(f"{where}: expected a mapping")
    for key in raw:
        if not isinstance(key, str):
            raise WebConfigError(f"{where}: key {key!r} is not a string")
        if keys is not None and key not in keys:
            prefix = "" if where == "the file" else f"{where}."
            raise WebConfigError(f"unknown key {prefix}{key}")
    return raw


def _strings(raw: Any, where: str) -> tuple[str, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(isinstance(s, str) for s in raw):
        raise WebConfigError(f"{where}: expected a list of strings")
    return tuple(raw)


def _bool(raw: Any, where: str) -> bool:
    if not isinstance(raw, bool):
        raise WebConfigError(f"{where}: expected true or false")
    return raw


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError):
        return exc.reason or str(exc)
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror
    return str(exc)


@contextlib.contextmanager
def _pem_path(path: Path | None, pem: str | None) -> Iterator[str]:
    """A path ssl can load: ``path`` itself, or inline PEM in an anonymous memory file (Linux) or
    a private temporary file removed at once."""
    if path is not None:
        yield str(path)
        return
    data = (pem or "").encode()
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("kvdoctor-pem")
        try:
            os.write(fd, data)
            yield f"/proc/self/fd/{fd}"
        finally:
            os.close(fd)
        return
    with tempfile.TemporaryDirectory(prefix="kvdoctor-pem-") as folder:
        file = Path(folder) / "pem"
        file.write_bytes(data)
        file.chmod(0o600)
        yield str(file)


__all__ = ["RateLimit", "TLSServerConfig", "WebConfig", "WebConfigError", "load_web_config", "parse_duration"]
