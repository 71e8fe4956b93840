"""Optional TLS for every gRPC server and client, mutual between services.

Configuration, read from the environment (files in PEM):

- KESTREL_TLS_CERT_FILE, KESTREL_TLS_KEY_FILE: this process's certificate and key. A
  server presents them; a client presents them to servers that ask (mutual TLS).
- KESTREL_TLS_CA_FILE: the CA that signs the peers. A client verifies servers
  against it; a server given it requires and verifies client certificates.

Nothing set: plaintext, as before (every service binds loopback by default). A
server needs the certificate and key; a client needs at least the CA. Between
services, set all three everywhere: each server then accepts only clients with a
certificate from the CA, and each client only servers with one. The SDK and the
CLI read the same variables (a client outside the plane without a certificate of
its own can still verify the gateway when the gateway does not require one).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import grpc

CERT = "KESTREL_TLS_CERT_FILE"
KEY = "KESTREL_TLS_KEY_FILE"
CA = "KESTREL_TLS_CA_FILE"


class TlsError(ValueError):
    pass


def _read(var: str, path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise TlsError(f"{var}={path}: {exc.strerror}") from exc


@dataclass(frozen=True)
class Tls:
    cert: bytes | None = None
    key: bytes | None = None
    ca: bytes | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Tls:
        """From `env` (default: this process's environment)."""
        env = os.environ if env is None else env
        paths = {v: env.get(v, "") for v in (CERT, KEY, CA)}
        if bool(paths[CERT]) != bool(paths[KEY]):
            raise TlsError(f"{CERT} and {KEY} go together (one is set, not the other)")
        return cls(*(_read(v, p) if p else None for v, p in paths.items()))

    @property
    def serving(self) -> bool:
        return self.cert is not None

    @property
    def dialing(self) -> bool:
        return self.ca is not None

    def server_credentials(self) -> grpc.ServerCredentials:
        if self.cert is None or self.key is None:
            raise TlsError(f"a TLS server needs {CERT} and {KEY}")
        return grpc.ssl_server_credentials([(self.key, self.cert)],
                                           root_certificates=self.ca,
                                           require_client_auth=self.ca is not None)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(root_certificates=self.ca, private_key=self.key,
                                            certificate_chain=self.cert)


def channel(address: str, tls: Tls | None = None) -> grpc.Channel:
    """A blocking channel: TLS when KESTREL_TLS_CA_FILE is set, else plaintext."""
    t = tls if tls is not None else Tls.from_env()
    if t.dialing:
        return grpc.secure_channel(address, t.channel_credentials())
    return grpc.insecure_channel(address)


def aio_channel(address: str, tls: Tls | None = None) -> grpc.aio.Channel:
    """An asyncio channel, likewise."""
    t = tls if tls is not None else Tls.from_env()
    if t.dialing:
        return grpc.aio.secure_channel(address, t.channel_credentials())
    return grpc.aio.insecure_channel(address)
