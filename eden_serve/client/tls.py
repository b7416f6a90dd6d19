"""What a client trusts when it reaches servers over TLS (:class:`ClientTLS`); what a node
presents is :class:`eden_serve.serving.tls.ServerTLS`. docs/tls.md has the whole story."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

from ..errors import BadInputError


@dataclass(frozen=True)
class ClientTLS:
    """What a client trusts: the CA (PEM) that signed the servers' certificates; None: the
    system's CAs. TorchServe 0.12 asks for no client certificate, so there is none to give."""

    cacert: Path | None = None

    @classmethod
    def from_file(cls, cacert: str | Path | None) -> "ClientTLS":
        if cacert is None:
            return cls()
        tls = cls(Path(cacert))
        tls.ssl_context()
        return tls

    @property
    def verify(self) -> str | bool:
        """requests' ``verify``."""
        return str(self.cacert) if self.cacert is not None else True

    def ssl_context(self) -> ssl.SSLContext:
        """A context that checks servers' certificates and names against this CA (gRPC channels,
        raw sockets)."""
        try:
            return ssl.create_default_context(cafile=self.cacert)
        except FileNotFoundError:
            raise BadInputError(f"--cacert {str(self.cacert)!r}: no such file") from None
        except (ssl.SSLError, OSError, ValueError) as exc:
            raise BadInputError(f"--cacert {str(self.cacert)!r} is not a PEM CA certificate ({exc})") from None

