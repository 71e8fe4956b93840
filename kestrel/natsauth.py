"""Least privilege on the bus: one NATS user per service, allowed only its subjects.

Every Kestrel process connects as a user of its own (`nats://<user>:<password>@…`).
What a user may publish and subscribe is an allow list; anything else the server
refuses ("Permissions Violation"), so a compromised or buggy service cannot forge
another's messages:

- only the meter publishes `kestrel.runway.>` (the budget every service acts on);
- only the placer publishes `kestrel.workload.>` (what the ledger is written from);
- only admission publishes `kestrel.jobs.admitted.>` and `kestrel.jobs.state.>`;
- only the placer publishes `kestrel.checks.workloads` (the Workloads the runway check
  decides on, kestrel.checkfeed), and only admission reads it and asks for a full set
  on `kestrel.checks.sync`;
- the gateway publishes nothing: it watches `kestrel.jobs.state.>` for WatchJob and
  reads the runway stream (Infer's budget gate), through JetStream's API alone;
- each service parks bad messages on its own `kestrel.deadletter.<service>` only;
- `tap`, the operators' `kestrel tap`, reads `kestrel.>` and publishes nothing;
- `admin` (stream set-up by tests and benches, purges) may do everything.

JetStream is reached through its API subjects, granted per verb: a service may
look up, create and update streams (each ensures the streams it uses at start),
and create, read, pull from, acknowledge and reset its own durable consumer (by
name: the meter cannot touch admission's consumer of the same stream) and
ephemeral consumers of the runway stream; it never deletes or purges a stream, a
message or a durable consumer. Replies come back on a
per-user inbox prefix (`_INBOX_<user>`, set by kestrel.bus.connect), so one user
cannot read another's replies. Pure data and text: no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import quote, urlsplit

ADMIN = "admin"
TAP = "tap"
JS = "$JS.API"


@dataclass(frozen=True)
class Grants:
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]


def inbox_prefix(user: str) -> str:
    return f"_INBOX_{user}"


def _streams_setup() -> tuple[str, ...]:
    return (f"{JS}.INFO", f"{JS}.STREAM.NAMES", f"{JS}.STREAM.INFO.*",
            f"{JS}.STREAM.CREATE.*", f"{JS}.STREAM.UPDATE.*")


def _consume(stream: str, durable: str = "") -> tuple[str, ...]:
    """Create, inspect, pull from, reset and acknowledge one durable consumer of
    `stream`; or, without `durable`, the ephemeral consumers of a last-value stream
    (kestrel.runway: named by the server, pulled from, made again when lost, deleted
    at stop)."""
    if durable:
        tail = f"{stream}.{durable}"
        verbs = [f"{JS}.CONSUMER.{verb}.{tail}" for verb in (
            "CREATE", "DURABLE.CREATE", "INFO", "MSG.NEXT", "RESET")]
        return (*verbs, f"{JS}.CONSUMER.CREATE.{tail}.>", f"$JS.ACK.{tail}.>")
    out: list[str] = []
    for verb in ("CREATE", "INFO", "DELETE", "MSG.NEXT"):
        out += [f"{JS}.CONSUMER.{verb}.{stream}", f"{JS}.CONSUMER.{verb}.{stream}.>"]
    return (*out, f"$JS.ACK.{stream}.>")


def _service(user: str, publishes: Sequence[str], subscribes: Sequence[str],
             consumes: Sequence[tuple[str, str]]) -> Grants:
    js = [p for stream, durable in consumes for p in _consume(stream, durable)]
    return Grants(
        publish=(*publishes, f"kestrel.deadletter.{user}", *_streams_setup(), *js),
        subscribe=(*subscribes, f"{inbox_prefix(user)}.>"))


GRANTS: Mapping[str, Grants] = {
    # No stream set-up and no deadletter: the gateway only reads the runway stream.
    "gateway": Grants(publish=(f"{JS}.STREAM.INFO.KESTREL_RUNWAY",
                               *_consume("KESTREL_RUNWAY", "")),
                      subscribe=("kestrel.jobs.state.>", f"{inbox_prefix('gateway')}.>")),
    "admission": _service("admission", ("kestrel.jobs.admitted.>", "kestrel.jobs.state.>",
                                        "kestrel.checks.sync"),
                          ("kestrel.checks.workloads",),
                          (("KESTREL_RUNWAY", ""), ("KESTREL_WORKLOADS", "admission"))),
    "placer": _service("placer", ("kestrel.workload.>", "kestrel.checks.workloads"),
                       ("kestrel.checks.sync",),
                       (("KESTREL_RUNWAY", ""), ("KESTREL_JOBS", "placer"))),
    "meter": _service("meter", ("kestrel.runway.>",), ("kestrel.jobs.state.>",),
                      (("KESTREL_WORKLOADS", "meter"),)),
    "autoscaler": _service("autoscaler", ("kestrel.endpoint.>",), (),
                           (("KESTREL_RUNWAY", ""),)),
    TAP: Grants(publish=(), subscribe=("kestrel.>", f"{inbox_prefix(TAP)}.>")),
    ADMIN: Grants(publish=(">",), subscribe=(">",)),
}
SERVICES = tuple(u for u in GRANTS if u not in (TAP, ADMIN))


def may_publish(user: str, subject: str) -> bool:
    """What the server will decide for a publish of `user` on `subject`."""
    return any(matches(pattern, subject) for pattern in GRANTS[user].publish)


def matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: `*` one token, `>` one or more trailing tokens."""
    pt, st = pattern.split("."), subject.split(".")
    for i, p in enumerate(pt):
        if p == ">":
            return len(st) > i
        if i >= len(st) or (p != "*" and p != st[i]):
            return False
    return len(pt) == len(st)


def _permissions(g: Grants) -> dict[str, object]:
    # An empty allow list would mean "no restriction": deny everything instead.
    pub: dict[str, object] = {"allow": list(g.publish)} if g.publish else {"deny": [">"]}
    return {"publish": pub, "subscribe": {"allow": list(g.subscribe)}}


@dataclass(frozen=True)
class Cluster:
    """One node's place in a JetStream cluster: its name (unique in the cluster), the
    port it takes routes on, the other nodes' route ports, and the password every
    route authenticates with (user ROUTE_USER)."""

    server_name: str
    route_port: int
    peer_route_ports: tuple[int, ...]
    route_password: str
    name: str = "kestrel"


ROUTE_USER = "route"


def server_config(host: str, port: int, monitor_port: int, store_dir: str,
                  passwords: Mapping[str, str], cluster: Cluster | None = None) -> str:
    """nats-server configuration (JSON is valid NATS config) with every user above;
    with `cluster`, the node's routes to its peers (Raft-replicated JetStream)."""
    users = [{"user": user, "password": passwords[user], "permissions": _permissions(g)}
             for user, g in GRANTS.items()]
    conf: dict[str, object] = {"host": host, "port": port, "http": f"{host}:{monitor_port}",
                               "jetstream": {"store_dir": store_dir},
                               "authorization": {"users": users}}
    if cluster is not None:
        secret = quote(cluster.route_password, safe="")
        conf["server_name"] = cluster.server_name
        conf["cluster"] = {
            "name": cluster.name, "host": host, "port": cluster.route_port,
            "authorization": {"user": ROUTE_USER, "password": cluster.route_password},
            "routes": [f"nats-route://{ROUTE_USER}:{secret}@{host}:{p}"
                       for p in cluster.peer_route_ports]}
    return json.dumps(conf, indent=2) + "\n"


def url(host: str, port: int, user: str, password: str) -> str:
    return f"nats://{quote(user, safe='')}:{quote(password, safe='')}@{host}:{port}"


def servers(nats_url: str) -> list[str]:
    """The URLs of a comma-separated list (a cluster's nodes), as nats-py takes them:
    the client picks one and moves to another when it goes."""
    return [u.strip() for u in nats_url.split(",") if u.strip()]


def user_of(nats_url: str) -> str:
    """The user a URL connects as ("" without credentials)."""
    first = nats_url.split(",")[0]
    return urlsplit(first).username or ""
