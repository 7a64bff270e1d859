"""The cluster CA and the brokers' certificates (pure: PEM text in, PEM text out).

Keys are EC P-256 in PKCS#8 PEM, which Python's ssl, librdkafka and the Java client's PEM
keystores all read. A broker's keystore file is its key followed by its certificate and
the CA's (the chain a client verifies up to the CA it trusts).
"""

from __future__ import annotations

import ipaddress
from datetime import UTC, datetime, timedelta
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_VALIDITY = timedelta(days=5 * 365)
CERT_VALIDITY = timedelta(days=365)
# A broker certificate is replaced once it has less than this left (brokers reload the
# mounted file without a restart: ssl.reload.interval.ms).
RENEW_BEFORE = timedelta(days=30)
# The CA is replaced a year before it expires. The old one stays trusted (in every
# `ca.crt` bundle) until it expires; broker certificates it signed are kept for
# ROLLOVER_GRACE after the new CA is published, so that brokers and clients have the
# bundle before any certificate of the new CA is shown to them.
CA_RENEW_BEFORE = timedelta(days=365)
ROLLOVER_GRACE = timedelta(days=1)
_BACKDATE = timedelta(minutes=5)  # clocks a little behind still accept a new certificate
_CA_USAGE = x509.KeyUsage(
    digital_signature=True,
    key_cert_sign=True,
    crl_sign=True,
    content_commitment=False,
    key_encipherment=False,
    data_encipherment=False,
    key_agreement=False,
    encipher_only=False,
    decipher_only=False,
)
_SERVER_AND_CLIENT = x509.ExtendedKeyUsage(
    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


def _cert_pem(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def _name(cn: str, organization: str | None = "straitmq") -> x509.Name:
    org = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization)] if organization else []
    return x509.Name([*org, x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def new_ca(cluster: str, namespace: str, now: datetime | None = None) -> tuple[str, str]:
    """(key PEM, certificate PEM) of a new self-signed CA for one MQCluster."""
    now = now or datetime.now(UTC)
    key = _key()
    name = _name(f"{cluster}.{namespace} cluster CA")
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + CA_VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_CA_USAGE, critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .sign(key, hashes.SHA256())
    )
    return _key_pem(key), _cert_pem(cert)


def issue(
    ca_key_pem: str,
    ca_cert_pem: str,
    common_name: str,
    dns_names: list[str],
    now: datetime | None = None,
    validity: timedelta = CERT_VALIDITY,
    organization: str | None = "straitmq",
) -> tuple[str, str]:
    """(key PEM, certificate PEM) for a server (and client: replication, mTLS) with these
    DNS names, signed by the CA. The cluster's own certificates say O=straitmq; a User's
    has its CN alone (principal User:CN=<name>), so no user name can pass for them."""
    now = now or datetime.now(UTC)
    ca_key = serialization.load_pem_private_key(ca_key_pem.encode(), password=None)
    # The kinds that sign with SHA-256 (new_ca makes EC; a CA brought along may be RSA).
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey | dsa.DSAPrivateKey):
        raise ValueError(f"the cluster CA key ({type(ca_key).__name__}) cannot sign with SHA-256")
    ca_cert = x509.load_pem_x509_certificate(ca_cert_pem.encode())
    ca_public: Any = ca_cert.public_key()
    key = _key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name, organization))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(min(now + validity, ca_cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName([_san(d) for d in dns_names]), False)
        .add_extension(_SERVER_AND_CLIENT, False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_public), False)
        .sign(ca_key, hashes.SHA256())
    )
    return _key_pem(key), _cert_pem(cert)


def keystore(key_pem: str, cert_pem: str, ca_cert_pem: str) -> str:
    """A PEM keystore: the key, then the certificate chain."""
    return key_pem + cert_pem + ca_cert_pem


def certificate(pem: str) -> x509.Certificate:
    """The first certificate in a PEM text (a keystore's leaf)."""
    return x509.load_pem_x509_certificate(pem.encode())


def _san(name: str) -> x509.GeneralName:
    """An IP address as an IP SAN (what clients check an address against), else DNS."""
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def dns_names(cert: x509.Certificate) -> list[str]:
    """The certificate's DNS names and IP addresses (as text), as pki.issue was given them."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return []
    ips = [str(ip) for ip in san.value.get_values_for_type(x509.IPAddress)]
    return list(san.value.get_values_for_type(x509.DNSName)) + ips


def signed_by(cert: x509.Certificate, ca_cert_pem: str) -> bool:
    ca = x509.load_pem_x509_certificate(ca_cert_pem.encode())
    try:
        cert.verify_directly_issued_by(ca)
    except (InvalidSignature, ValueError, TypeError):
        return False
    return True


def due(
    cert: x509.Certificate, now: datetime | None = None, renew_before: timedelta = RENEW_BEFORE
) -> bool:
    """True once the certificate has less than `renew_before` left."""
    now = now or datetime.now(UTC)
    return cert.not_valid_after_utc - now < renew_before


def needs_new(
    pem: str | None,
    ca_cert_pem: str,
    names: list[str],
    now: datetime | None = None,
    also_trusted: list[str] | tuple[str, ...] = (),
) -> str | None:
    """Why a broker's keystore must be issued again (a sentence), or None if it is good:
    missing, unreadable, from another CA (than `ca_cert_pem` or `also_trusted`), other
    DNS names, or close to expiry."""
    if not pem:
        return "no certificate yet"
    try:
        cert = certificate(pem)
    except ValueError:
        return "the certificate cannot be read"
    if not any(signed_by(cert, ca) for ca in (ca_cert_pem, *also_trusted)):
        return "signed by another CA"
    if sorted(dns_names(cert)) != sorted(names):
        return "its DNS names changed"
    if due(cert, now):
        return f"it expires {cert.not_valid_after_utc:%Y-%m-%d}"
    return None
