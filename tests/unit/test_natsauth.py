"""Least privilege on the bus, as data: who may publish what (kestrel.natsauth)."""

from __future__ import annotations

import json

import pytest

from kestrel import natsauth
from kestrel.natsauth import matches, may_publish


@pytest.mark.parametrize(("pattern", "subject", "want"), [
    ("kestrel.runway.>", "kestrel.runway.acme", True),
    ("kestrel.runway.>", "kestrel.runway", False),
    ("kestrel.runway.*", "kestrel.runway.acme.x", False),
    ("$JS.API.STREAM.INFO.*", "$JS.API.STREAM.INFO.KESTREL_JOBS", True),
    ("$JS.API.CONSUMER.CREATE.KESTREL_JOBS", "$JS.API.CONSUMER.CREATE.KESTREL_JOBS", True),
    ("$JS.API.CONSUMER.CREATE.KESTREL_JOBS.>", "$JS.API.CONSUMER.CREATE.KESTREL_RUNWAY.x",
     False),
    (">", "anything.at.all", True),
])
def test_subjects_match_as_nats_matches_them(pattern: str, subject: str, want: bool) -> None:
    assert matches(pattern, subject) is want


# Each bus subject a Kestrel message travels on, and the one user that may send it.
OWNERS = {
    "kestrel.runway.acme": "meter",
    "kestrel.workload.acme.finished": "placer",
    "kestrel.jobs.admitted.acme": "admission",
    "kestrel.jobs.state.acme": "admission",
}


@pytest.mark.parametrize("user", (*natsauth.SERVICES, natsauth.TAP))
def test_only_the_owner_of_a_subject_may_publish_on_it(user: str) -> None:
    for subject, owner in OWNERS.items():
        assert may_publish(user, subject) is (user == owner), (user, subject)
    for service in natsauth.SERVICES:
        assert may_publish(user, f"kestrel.deadletter.{service}") is (
            user == service and user != "gateway"), (user, service)


@pytest.mark.parametrize("user", (*natsauth.SERVICES, natsauth.TAP))
def test_no_service_may_delete_or_purge_a_stream_or_a_durable_consumer(user: str) -> None:
    for verb in ("STREAM.DELETE.KESTREL_WORKLOADS", "STREAM.PURGE.KESTREL_WORKLOADS",
                 "STREAM.MSG.DELETE.KESTREL_WORKLOADS", "CONSUMER.DELETE.KESTREL_WORKLOADS.meter"):
        subject = f"$JS.API.{verb}"
        assert not may_publish(user, subject), (user, subject)


def test_the_meter_consumes_workloads_and_the_placer_admitted_jobs_only() -> None:
    assert may_publish("meter", "$JS.API.CONSUMER.MSG.NEXT.KESTREL_WORKLOADS.meter")
    assert not may_publish("meter", "$JS.API.CONSUMER.MSG.NEXT.KESTREL_JOBS.placer")
    assert may_publish("placer", "$JS.API.CONSUMER.RESET.KESTREL_JOBS.placer")
    assert not may_publish("placer", "$JS.ACK.KESTREL_WORKLOADS.meter.1.2.3.4.5")
    # Two consumers of one stream: neither may pull, ack or reset the other's.
    assert not may_publish("meter", "$JS.API.CONSUMER.MSG.NEXT.KESTREL_WORKLOADS.admission")
    assert not may_publish("admission", "$JS.ACK.KESTREL_WORKLOADS.meter.1.2.3.4.5")
    assert not may_publish("admission", "$JS.API.CONSUMER.RESET.KESTREL_WORKLOADS.meter")


def test_each_user_reads_replies_only_on_its_own_inbox() -> None:
    for user in natsauth.GRANTS:
        if user == natsauth.ADMIN:
            continue
        inboxes = [s for s in natsauth.GRANTS[user].subscribe if s.startswith("_INBOX")]
        assert inboxes == [f"_INBOX_{user}.>"]


def test_the_server_configuration_lists_every_user_and_denies_tap_every_publish() -> None:
    conf = json.loads(natsauth.server_config("127.0.0.1", 4222, 8222, "/tmp/js",
                                              {u: f"pw-{u}" for u in natsauth.GRANTS}))
    users = {u["user"]: u for u in conf["authorization"]["users"]}
    assert set(users) == set(natsauth.GRANTS)
    assert users["tap"]["permissions"]["publish"] == {"deny": [">"]}
    assert users["meter"]["password"] == "pw-meter"
    assert conf["jetstream"] == {"store_dir": "/tmp/js"}


def test_a_url_names_its_user() -> None:
    url = natsauth.url("127.0.0.1", 4222, "meter", "p@ss/word")
    assert url == "nats://meter:p%40ss%2Fword@127.0.0.1:4222"
    assert natsauth.user_of(url) == "meter"
    assert natsauth.user_of("nats://127.0.0.1:4222") == ""


def test_a_cluster_node_routes_to_its_peers_with_the_route_password() -> None:
    conf = json.loads(natsauth.server_config(
        "127.0.0.1", 4222, 8222, "/tmp/js", {u: f"pw-{u}" for u in natsauth.GRANTS},
        natsauth.Cluster("nats-2", 6222, (6223, 6224), "r/p")))
    assert conf["server_name"] == "nats-2"
    assert conf["cluster"]["port"] == 6222
    assert conf["cluster"]["authorization"] == {"user": "route", "password": "r/p"}
    assert conf["cluster"]["routes"] == ["nats-route://route:r%2Fp@127.0.0.1:6223",
                                         "nats-route://route:r%2Fp@127.0.0.1:6224"]
    alone = json.loads(natsauth.server_config("127.0.0.1", 4222, 8222, "/tmp/js",
                                              {u: "p" for u in natsauth.GRANTS}))
    assert "cluster" not in alone and "server_name" not in alone


def test_a_cluster_url_is_every_node_and_names_its_user_once() -> None:
    urls = ",".join(natsauth.url("127.0.0.1", p, "meter", "pw") for p in (4222, 4223, 4224))
    assert natsauth.servers(urls) == [f"nats://meter:pw@127.0.0.1:{p}"
                                      for p in (4222, 4223, 4224)]
    assert natsauth.servers(" nats://a:1 , ") == ["nats://a:1"]
    assert natsauth.user_of(urls) == "meter"
