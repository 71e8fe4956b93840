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

import ipaddress
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


def dial_target(address: str) -> tuple[str, list[tuple[str, str | int]]]:
    """The gRPC target and channel options for `address`: one `host:port`, a
    `dns:///name:port` (every address the name resolves to), or several replicas as
    `ip:port,ip:port` (on loopback: one port each). The last two balance calls round
    robin over every replica instead of pinning the channel to the first one."""
    parts = [a.strip() for a in address.split(",") if a.strip()]
    if len(parts) <= 1 and not address.startswith("dns:"):
        return address, []
    balanced: list[tuple[str, str | int]] = [("grpc.lb_policy_name", "round_robin")]
    if address.startswith("dns:"):
        return address, balanced
    hosts = []
    for part in parts:
        host, sep, port = part.rpartition(":")
        host = host.strip("[]")
        if not sep or not port.isdigit():
            raise ValueError(f"{address!r}: {part!r} is not ip:port")
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            raise ValueError(
                f"{address!r}: a list of replicas takes IP addresses ({host!r} is a name); "
                "for a name, give one that resolves to every replica as dns:///name:port"
            ) from None
        hosts.append((ip, port))
    if len({ip.version for ip, _ in hosts}) != 1:
        raise ValueError(f"{address!r}: the replicas' addresses mix IPv4 and IPv6")
    scheme = "ipv4" if hosts[0][0].version == 4 else "ipv6"
    target = f"{scheme}:" + ",".join(
        f"{ip}:{port}" if ip.version == 4 else f"[{ip}]:{port}" for ip, port in hosts)
    # The authority a server certificate is checked against: the first replica's.
    return target, [*balanced, ("grpc.default_authority", parts[0])]


def channel(address: str, tls: Tls | None = None) -> grpc.Channel:
    """A blocking channel: TLS when KESTREL_TLS_CA_FILE is set, else plaintext."""
    t = tls if tls is not None else Tls.from_env()
    target, options = dial_target(address)
    if t.dialing:
        return grpc.secure_channel(target, t.channel_credentials(), options=options)
    return grpc.insecure_channel(target, options=options)


def aio_channel(address: str, tls: Tls | None = None) -> grpc.aio.Channel:
    """An asyncio channel, likewise."""
    t = tls if tls is not None else Tls.from_env()
    target, options = dial_target(address)
    if t.dialing:
        return grpc.aio.secure_channel(target, t.channel_credentials(), options=options)
    return grpc.aio.insecure_channel(target, options=options)
