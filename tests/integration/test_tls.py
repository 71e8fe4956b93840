"""Optional TLS (kestrel_sdk.tls): the gateway, admission and meter as real processes with
certificates this test makes (openssl), mutual between services and toward clients.

With KESTREL_TLS_CERT_FILE/KEY_FILE/CA_FILE set every server requires a client
certificate from the CA, and every hop (gateway -> admission, gateway -> meter) is
dialled with the service's own certificate: a job submitted through the gateway
passes both. A plaintext client, a TLS client without a certificate and one with a
certificate from another CA are all refused."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from kestrel_sdk import Client, KestrelError, Unavailable
from kestrel_sdk.tls import CA, CERT, KEY, Tls
from tests.conftest import OPERATOR_TOKEN, Plane

pytestmark = pytest.mark.integration


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _ca(d: Path, name: str) -> None:
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
             "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.crt", "-days", "2",
             "-subj", f"/CN={name}", cwd=d)


def _leaf(d: Path, ca: str, name: str) -> None:
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=d)
    (d / f"{name}.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                                   "extendedKeyUsage=serverAuth,clientAuth\n")
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile",
             f"{name}.ext", cwd=d)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tls")
    _ca(d, "ca")
    _leaf(d, "ca", "plane")   # every service's own
    _leaf(d, "ca", "client")  # a tenant's or an operator's
    _ca(d, "rogue")
    _leaf(d, "rogue", "intruder")
    return d


def _creds(d: Path, leaf: str | None, ca: str = "ca") -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(
        root_certificates=(d / f"{ca}.crt").read_bytes(),
        private_key=(d / f"{leaf}.key").read_bytes() if leaf else None,
        certificate_chain=(d / f"{leaf}.crt").read_bytes() if leaf else None)


@pytest.fixture
def tls_plane(service_env: dict[str, str], tmp_path: Path, certs: Path) -> Iterator[Plane]:
    env = {**service_env, CERT: str(certs / "plane.crt"), KEY: str(certs / "plane.key"),
           CA: str(certs / "ca.crt")}
    p = Plane(env, tmp_path)
    try:
        for name in ("meter", "gateway", "admission"):
            p.start(name)  # each waits for the server's health over mutual TLS
        yield p
    finally:
        p.stop_all()


def test_a_job_passes_every_hop_over_mutual_tls(tls_plane: Plane, certs: Path) -> None:
    addr = tls_plane.address("gateway")
    with Client(addr, operator_token=OPERATOR_TOKEN,
                channel_credentials=_creds(certs, "client")) as op:
        op.create_tenant("tls-a", gpu_quota={"gpu-h100": 4}, rate_per_s=10, burst=10,
                         initial_credits="10")
        key = op.create_api_key("tls-a", "k")
    with Client(addr, api_key=key.secret, channel_credentials=_creds(certs, "client")) as me:
        job = me.submit_job(name="over-tls", gpus=1, max_duration_s=60)
        assert job.state.name == "ADMITTED"  # admission decided it: gateway -> admission
        assert me.runway().credits == 10     # the meter's figure: gateway -> meter


@pytest.mark.parametrize(("who", "creds"), [
    ("a plaintext client", None),
    ("a TLS client without a certificate", "none"),
    ("a client whose certificate another CA signed", "intruder"),
])
def test_a_client_without_the_plane_s_trust_is_refused(
        tls_plane: Plane, certs: Path, who: str, creds: str | None) -> None:
    addr = tls_plane.address("gateway")
    if creds is None:
        client = Client(addr, operator_token=OPERATOR_TOKEN, timeout_s=3)
    else:
        leaf = None if creds == "none" else creds
        client = Client(addr, operator_token=OPERATOR_TOKEN, timeout_s=3,
                        channel_credentials=_creds(certs, leaf))
    with client, pytest.raises(KestrelError) as err:
        client.get_tenant("anyone")
    assert isinstance(err.value, Unavailable), (who, err.value)


def test_the_sdk_and_cli_read_the_same_variables(
        tls_plane: Plane, certs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CERT, str(certs / "client.crt"))
    monkeypatch.setenv(KEY, str(certs / "client.key"))
    monkeypatch.setenv(CA, str(certs / "ca.crt"))
    with Client(tls_plane.address("gateway"), operator_token=OPERATOR_TOKEN) as op:
        assert [t.tenant for t in op.list_tenants()] == []


def test_a_half_configured_certificate_is_a_clear_error(
        certs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CERT, str(certs / "plane.crt"))
    monkeypatch.delenv(KEY, raising=False)
    with pytest.raises(ValueError, match="go together"):
        Tls.from_env()
    monkeypatch.setenv(KEY, str(certs / "missing.key"))
    with pytest.raises(ValueError, match=r"missing\.key"):
        Tls.from_env()
