"""TLS served by TorchServe itself: what a node presents (:class:`ServerTLS`); what a client
trusts is :class:`eden_serve.client.tls.ClientTLS`. docs/tls.md has the whole story.

TorchServe 0.12 serves HTTPS on every address written ``https://`` with the PEM files
``certificate_file`` and ``private_key_file``, and gRPC over TLS with the same files when
``enable_grpc_ssl`` is true. Its frontend reads only RSA keys (``KeyFactory.getInstance("RSA")``),
its gRPC server only unencrypted PKCS#8 ones, and it offers TLS 1.2 alone, with two ECDHE-RSA
AES-128 suites; it never asks a client for a certificate, so mutual TLS is not possible.
"""

from __future__ import annotations

import base64
import hashlib
import re
import ssl
from dataclasses import dataclass
from pathlib import Path

import requests
from requests.adapters import HTTPAdapter

from ..errors import BadInputError
from ..wire.keyed import check_secret_file

ADDRESSES = ("inference_address", "management_address", "metrics_address")
# The rsaEncryption algorithm identifier (1.2.840.113549.1.1.1) as DER, inside a PKCS#8 key.
_RSA_OID = bytes.fromhex("06092a864886f70d010101")
MIN_RSA_BITS = 2048
_PEM = re.compile(rb"-----BEGIN ([A-Z ]+)-----\s*([A-Za-z0-9+/=\s]+?)-----END \1-----")


def _rsa_bits(der: bytes) -> int:
    """The bits of a PKCS#8 RSA key's modulus; 0 where its DER does not read as one."""

    def field(at: int) -> tuple[int, int]:  # where a DER field's value starts and ends
        length, at = der[at + 1], at + 2
        if length & 0x80:
            count = length & 0x7F
            length, at = int.from_bytes(der[at:at + count], "big"), at + count
        return at, at + length

    try:
        inside, _ = field(0)  # PrivateKeyInfo
        inside, _ = field(field(field(inside)[1])[1])  # past the version and the algorithm: the key's OCTET STRING
        inside, _ = field(inside)  # RSAPrivateKey
        start, end = field(field(inside)[1])  # past its version: the modulus
        return int.from_bytes(der[start:end], "big").bit_length()
    except IndexError:
        return 0


def _pem_blocks(path: Path, what: str) -> list[tuple[str, bytes]]:
    try:
        text = path.read_bytes()
    except OSError as exc:
        raise BadInputError(f"cannot read the TLS {what} {str(path)!r}: {exc.strerror}") from None
    return [(kind.decode(), base64.b64decode(body)) for kind, body in _PEM.findall(text)]


@dataclass(frozen=True)
class ServerTLS:
    """A node's certificate chain and RSA key, PEM files that TorchServe reads at start."""

    cert: Path
    key: Path

    @classmethod
    def from_files(cls, cert: str | Path, key: str | Path) -> "ServerTLS":
        """Checked as TorchServe 0.12 will read them, so that a wrong file is one line here rather
        than a frontend that exits at start."""
        tls = cls(Path(cert).resolve(), Path(key).resolve())
        certificates = [der for kind, der in _pem_blocks(tls.cert, "certificate") if kind == "CERTIFICATE"]
        if not certificates:
            raise BadInputError(f"the TLS certificate {str(cert)!r} holds no PEM CERTIFICATE block")
        keys = _pem_blocks(tls.key, "key")
        kinds = [kind for kind, _ in keys]
        if kinds != ["PRIVATE KEY"]:
            raise BadInputError(
                f"the TLS key {str(key)!r} holds {', '.join(kinds) or 'no PEM block'}, not one unencrypted PKCS#8 PRIVATE KEY "
                "(TorchServe's gRPC server reads no other); convert it: openssl pkcs8 -topk8 -nocrypt -in KEY -out KEY.pk8"
            )
        if _RSA_OID not in keys[0][1][:32]:
            raise BadInputError(f"the TLS key {str(key)!r} is not an RSA key, and TorchServe 0.12 reads only RSA keys")
        bits = _rsa_bits(keys[0][1])
        if bits < MIN_RSA_BITS:
            raise BadInputError(f"the TLS key {str(key)!r} is an RSA key of {bits} bits, fewer than {MIN_RSA_BITS}; "
                                f"make one of {MIN_RSA_BITS} or more: openssl genrsa {MIN_RSA_BITS}")
        check_secret_file(tls.key, "the TLS key")
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(tls.cert, tls.key)
        except ssl.SSLError as exc:
            raise BadInputError(f"the TLS certificate {str(cert)!r} and key {str(key)!r} do not go together ({exc.reason})") from None
        return tls

    @classmethod
    def from_properties(cls, settings: dict[str, str]) -> "ServerTLS | None":
        """The TLS a TorchServe configuration asks for (an ``https://`` address), or None."""
        if not any(settings.get(name, "").lower().startswith("https://") for name in ADDRESSES):
            return None
        if "keystore" in settings:
            raise BadInputError("eden-serve serve reads PEM files, not a keystore (TorchServe's gRPC TLS needs them too); "
                                "set certificate_file and private_key_file, or pass --tls-cert and --tls-key")
        missing = [name for name in ("certificate_file", "private_key_file") if not settings.get(name)]
        if missing:
            raise BadInputError(f"an https:// address needs {' and '.join(missing)} (else TorchServe makes a self-signed "
                                "certificate no client can check); or pass --tls-cert and --tls-key")
        return cls.from_files(settings["certificate_file"], settings["private_key_file"])

    def properties(self, settings: dict[str, str]) -> dict[str, str]:
        """The entries that make the configuration ``settings`` serve TLS: its addresses as
        ``https://``, the two files, and gRPC over TLS."""
        entries = {name: re.sub(r"^https?://", "https://", settings[name], flags=re.I) for name in ADDRESSES if name in settings}
        return entries | {"certificate_file": str(self.cert), "private_key_file": str(self.key), "enable_grpc_ssl": "true"}

    def cert_der(self) -> bytes:
        """The certificate the server presents (the chain's first), in DER."""
        return next(der for kind, der in _pem_blocks(self.cert, "certificate") if kind == "CERTIFICATE")

    def fingerprint(self) -> str:
        return hashlib.sha256(self.cert_der()).hexdigest()

    def pinned_session(self) -> requests.Session:
        """A session that talks only to a server presenting exactly this certificate, whatever
        name it is reached by: the launcher's own checks of a server it started (0.0.0.0 or a
        loopback address is rarely a name in the certificate)."""
        session = requests.Session()
        session.verify = False  # the fingerprint below is checked instead, and no less strictly
        session.trust_env = False  # else $REQUESTS_CA_BUNDLE turns verification back on (and proxies apply)
        session.mount("https://", _PinnedAdapter(self.fingerprint()))
        return session


class _PinnedAdapter(HTTPAdapter):
    def __init__(self, fingerprint: str):
        self.fingerprint = fingerprint
        super().__init__()

    def init_poolmanager(self, *args, **kwargs):
        super().init_poolmanager(*args, assert_fingerprint=self.fingerprint, **kwargs)
