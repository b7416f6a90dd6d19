"""A throwaway certificate authority and server certificates, made at test time for the TLS tests
and the two-host benchmark (needs the ``cryptography`` package, in the test and bench extras).

    authority = Authority.create(tmp / "pki")               # tmp/pki/ca.pem: give it to clients
    cloud_tls = authority.issue("cloud", ["10.90.0.1"])      # a ServerTLS for launcher.torchserve

Keys are RSA (TorchServe 0.12 reads no other) in unencrypted PKCS#8 PEM, valid for a day.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from eden_serve.client.tls import ClientTLS
from eden_serve.serving.tls import ServerTLS

VALID_FOR = datetime.timedelta(days=1)
RSA_BITS = 2048


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(key: rsa.RSAPrivateKey, path: Path) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    path.chmod(0o600)


@dataclass
class Authority:
    directory: Path
    certificate: x509.Certificate
    key: rsa.RSAPrivateKey

    @property
    def cacert(self) -> Path:
        return self.directory / "ca.pem"

    @property
    def client(self) -> ClientTLS:
        return ClientTLS.from_file(self.cacert)

    @classmethod
    def create(cls, directory: str | Path, name: str = "eden-serve test CA") -> "Authority":
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        key = rsa.generate_private_key(public_exponent=65537, key_size=RSA_BITS)
        now = datetime.datetime.now(datetime.timezone.utc)
        certificate = (
            x509.CertificateBuilder().subject_name(_name(name)).issuer_name(_name(name))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + VALID_FOR)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                                         encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256())
        )
        authority = cls(directory, certificate, key)
        authority.cacert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
        return authority

    def issue(self, name: str, addresses: Iterable[str]) -> ServerTLS:
        """A server certificate for ``addresses`` (IP addresses or DNS names), signed by this CA:
        ``name.pem`` and ``name.key`` in the CA's directory."""
        key = rsa.generate_private_key(public_exponent=65537, key_size=RSA_BITS)
        names = []
        for address in addresses:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(address)))
            except ValueError:
                names.append(x509.DNSName(address))
        now = datetime.datetime.now(datetime.timezone.utc)
        certificate = (
            x509.CertificateBuilder().subject_name(_name(name)).issuer_name(self.certificate.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + VALID_FOR)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), critical=False)
            .sign(self.key, hashes.SHA256())
        )
        cert_path, key_path = self.directory / f"{name}.pem", self.directory / f"{name}.key"
        cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
        _write_key(key, key_path)
        return ServerTLS.from_files(cert_path, key_path)
