"""Keys and certificates of the deployment kit (`federation.flower.kit`, ``gastric-fl federation init``).

A throw-away CA (P-384, ``pathlen:0``) that signs only the SuperLink's TLS certificate, whose subjectAltName names
the addresses the others dial, and one SuperNode key pair per hospital. Flower 1.41 wants the SuperNode's key on a
NIST curve, the private key in OpenSSH format and the public key as one OpenSSH line (``ecdsa-sha2-nistp384
AAAA...``), which is what ``ssh-keygen -t ecdsa -b 384`` writes and what is written here with ``cryptography``
(Flower docs: "Enable TLS connections", "Authenticate SuperNodes").
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CURVE = ec.SECP384R1()  # P-384, as in Flower's "Authenticate SuperNodes" guide (ssh-keygen -t ecdsa -b 384)


def new_key() -> ec.EllipticCurvePrivateKey:
    """A fresh ECDSA P-384 private key."""
    return ec.generate_private_key(CURVE)


def openssh_private(key: ec.EllipticCurvePrivateKey) -> bytes:
    """The private key in OpenSSH format, unencrypted (what ``flower-supernode`` loads with no passphrase)."""
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )


def openssh_public(key: ec.EllipticCurvePrivateKey, comment: str = "") -> bytes:
    """The public key as one OpenSSH line (``ecdsa-sha2-nistp384 AAAA... comment``)."""
    line = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return line + (f" {comment}".encode() if comment else b"") + b"\n"


def pem_private(key: ec.EllipticCurvePrivateKey) -> bytes:
    """A TLS private key as unencrypted PKCS#8 PEM (what uvicorn's ``ssl_keyfile`` reads)."""
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def make_ca(valid_days: int) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A self-signed CA (P-384, ``pathlen:0``) that signs only this federation's server certificate."""
    key = new_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gastric-fl federation CA")])
    start = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)  # tolerate small clock skew between sites
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + dt.timedelta(days=valid_days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(cert_sign=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA384())
    )
    return key, cert


def make_server_cert(
    ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate, sans: Sequence[x509.GeneralName], valid_days: int
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """The SuperLink's TLS certificate, signed by the CA, for the names and addresses in ``sans``."""
    key = new_key()
    start = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    ca_ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gastric-fl SuperLink")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + dt.timedelta(days=valid_days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(cert_sign=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
        .sign(ca_key, hashes.SHA384())
    )
    return key, cert


def _key_usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=not cert_sign,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )
