"""What each container of docker-compose.yml is given (kestrel_tools.containers)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kestrel.pgroles import LOGIN_ROLES
from kestrel_tools import containers


def test_provision_makes_the_secrets_once_and_keeps_them(tmp_path: Path) -> None:
    first = containers.provision(tmp_path)
    assert set(first["passwords"]) >= set(LOGIN_ROLES)
    assert first["operator_token"].startswith("kso_")
    assert (tmp_path / containers.SECRETS_FILE).stat().st_mode & 0o777 == 0o640
    assert containers.provision(tmp_path) == first


@pytest.mark.parametrize("service", containers.SERVICES)
def test_a_service_is_given_its_own_credentials_and_no_one_elses(
        tmp_path: Path, service: str) -> None:
    env = containers.service_env(service, containers.provision(tmp_path))
    secret = {k for k in env if k.endswith(("_POSTGRES_DSN", "_NATS_URL"))}
    assert secret == {k for k in containers.SERVICE_KEYS[service] if k != "KESTREL_REDIS_URL"}
    assert all(k.startswith(f"KESTREL_{service.upper()}_") for k in secret)
    assert "KESTREL_POSTGRES_OWNER_DSN" not in env
    assert ("KESTREL_OPERATOR_TOKEN" in env) == (service in containers.NEEDS_TOKEN)
    assert env["KESTREL_BIND_HOST"] == "127.0.0.1"
    assert env[f"KESTREL_{service.upper()}_PORT"] == str(containers.PORTS[service])


def test_the_services_find_one_another_on_the_stack_s_own_ports(tmp_path: Path) -> None:
    env = containers.service_env("gateway", containers.provision(tmp_path))
    assert env["KESTREL_METER_ADDR"] == f"127.0.0.1:{containers.PORTS['meter']}"
    assert env["KESTREL_REDIS_URL"].endswith(
        f":{containers.PORTS['redis']}/0")
    client = containers.client_env(containers.provision(tmp_path))
    assert client["KESTREL_GATEWAY_ADDR"] == f"127.0.0.1:{containers.PORTS['gateway']}"
