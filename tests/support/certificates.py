"""Test certificates made on the spot with the openssl command: a CA, a server certificate for
127.0.0.1/localhost, a client certificate it signed, and one from a CA nobody trusts.

    pki = make_pki(tmp_path)              # skips the test when openssl is missing
    ssl_ctx = pki.client_context(with_client_cert=True)
    httpx.get(url, verify=ssl_ctx)

EC P-256 keys (fast to make, accepted by Go and OpenSSL alike); valid for two days.
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

_EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]


def _openssl(*args: str | Path, cwd: Path) -> None:
    result = subprocess.run(["openssl", *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(map(str, args[:2]))} failed: {result.stderr.strip()}")


def _ca(folder: Path, name: str) -> tuple[Path, Path]:
    cert, key = folder / f"{name}.crt", folder / f"{name}.key"
    _openssl(
        "req", "-x509", *_EC, "-days", "2", "-subj", f"/CN={name}", "-keyout", key, "-out", cert,
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=folder,
    )  # fmt: skip
    return cert, key


def _leaf(folder: Path, name: str, ca: tuple[Path, Path], usage: str, sans: str) -> tuple[Path, Path]:
    cert, key, csr, ext = (folder / f"{name}{suffix}" for suffix in (".crt", ".key", ".csr", ".ext"))
    ext.write_text(f"basicConstraints=CA:FALSE\nextendedKeyUsage={usage}\nsubjectAltName={sans}\n")
    _openssl("req", *_EC, "-subj", f"/CN={name}", "-keyout", key, "-out", csr, cwd=folder)
    _openssl(
        "x509", "-req", "-in", csr, "-CA", ca[0], "-CAkey", ca[1], "-CAcreateserial", "-days", "2",
        "-extfile", ext, "-out", cert,
        cwd=folder,
    )  # fmt: skip
    return cert, key


@dataclass(frozen=True)
class PKI:
    folder: Path
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    stranger_cert: Path  # a client certificate from a CA the server does not trust
    stranger_key: Path

    def client_context(self, cert: tuple[Path, Path] | None = None) -> ssl.SSLContext:
        """A client context trusting the test CA, presenting ``cert`` (certificate, key) if given."""
        ctx = ssl.create_default_context(cafile=str(self.ca))
        if cert is not None:
            ctx.load_cert_chain(str(cert[0]), str(cert[1]))
        return ctx

    @property
    def client(self) -> tuple[Path, Path]:
        return self.client_cert, self.client_key

    @property
    def stranger(self) -> tuple[Path, Path]:
        return self.stranger_cert, self.stranger_key

    def new_server_certificate(self, name: str) -> tuple[Path, Path]:
        """Another server certificate from the same CA (for rotation tests)."""
        return _leaf(self.folder, name, (self.ca, self.folder / "kvdoctor-test-ca.key"), "serverAuth", _SERVER_SANS)


_SERVER_SANS = "IP:127.0.0.1,DNS:localhost"


def make_pki(folder: Path, client_sans: str = "DNS:prometheus.kvdoctor.test") -> PKI:
    """The test CA, server, client and stranger certificates in ``folder``; skips without openssl."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make test certificates")
    folder.mkdir(parents=True, exist_ok=True)
    ca = _ca(folder, "kvdoctor-test-ca")
    server = _leaf(folder, "server", ca, "serverAuth", _SERVER_SANS)
    client = _leaf(folder, "client", ca, "clientAuth", client_sans)
    stranger_ca = _ca(folder, "stranger-ca")
    stranger = _leaf(folder, "stranger", stranger_ca, "clientAuth", client_sans)
    return PKI(folder, ca[0], *server, *client, *stranger)


__all__ = ["PKI", "make_pki"]
