"""Throwaway certificates for the TLS tests, made with the openssl CLI (EC P-256 keys,
PKCS#8 PEM, which librdkafka, Python and the Java client's PEM keystores all read)."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


def _run(*args: str, cwd: Path) -> None:
    r = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    assert r.returncode == 0, f"openssl {' '.join(args)}: {r.stderr}"


@dataclass
class Certs:
    dir: Path

    def path(self, name: str) -> str:
        return str(self.dir / name)

    def ca(self, name: str) -> None:
        """A self-signed CA: <name>.key, <name>.pem."""
        _run(
            "req",
            "-x509",
            "-new",
            "-nodes",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.pem",
            "-days",
            "2",
            "-subj",
            f"/CN={name}",
            cwd=self.dir,
        )

    def leaf(self, name: str, ca: str, subject: str, san: str) -> None:
        """<name>.key, <name>.crt, and <name>.pem = key + certificate (a PEM keystore)."""
        (self.dir / f"{name}.ext").write_text(f"subjectAltName={san}\n")
        _run(
            "req",
            "-new",
            "-nodes",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.csr",
            "-subj",
            subject,
            cwd=self.dir,
        )
        _run(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            f"{ca}.pem",
            "-CAkey",
            f"{ca}.key",
            "-CAcreateserial",
            "-out",
            f"{name}.crt",
            "-days",
            "2",
            "-extfile",
            f"{name}.ext",
            cwd=self.dir,
        )
        key = (self.dir / f"{name}.key").read_text()
        crt = (self.dir / f"{name}.crt").read_text()
        (self.dir / f"{name}.pem").write_text(key + crt)

    def expired_leaf(self, name: str, ca: str, subject: str) -> None:
        """Like `leaf`, valid for one day in 2020 (`openssl ca` can backdate; x509 cannot)."""
        (self.dir / "index.txt").write_text("")
        (self.dir / "ca.cnf").write_text(
            "[ca]\ndefault_ca = d\n[d]\ndatabase = index.txt\nnew_certs_dir = .\n"
            "serial = serial\ndefault_md = sha256\npolicy = p\nunique_subject = no\n"
            "[p]\ncommonName = supplied\norganizationName = optional\n"
        )
        (self.dir / "serial").write_text("1000\n")
        _run(
            "req",
            "-new",
            "-nodes",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.csr",
            "-subj",
            subject,
            cwd=self.dir,
        )
        _run(
            "ca",
            "-batch",
            "-config",
            "ca.cnf",
            "-cert",
            f"{ca}.pem",
            "-keyfile",
            f"{ca}.key",
            "-in",
            f"{name}.csr",
            "-out",
            f"{name}.crt",
            "-notext",
            "-startdate",
            "20200101000000Z",
            "-enddate",
            "20200102000000Z",
            cwd=self.dir,
        )


def make_certs(directory: Path) -> Certs:
    """ca (trusted) signs server (127.0.0.1/localhost), alice (C=US, O=Acme, CN=alice) and
    old (expired); evil (trusted by nobody) signs mallory."""
    directory.mkdir(parents=True, exist_ok=True)
    c = Certs(directory)
    c.ca("ca")
    c.ca("evil")
    c.leaf("server", "ca", "/CN=localhost", "IP:127.0.0.1,DNS:localhost")
    c.leaf("alice", "ca", "/C=US/O=Acme/CN=alice", "DNS:alice")
    c.leaf("mallory", "evil", "/CN=mallory", "DNS:mallory")
    c.expired_leaf("old", "ca", "/O=Acme/CN=old")  # trusted CA, expired in 2020
    return c
