"""TLS, mutual TLS, API keys and per-connection limits on a live daemon (docs/security.md).

The certificates are made here by the openssl command: a test CA, a server certificate for
localhost / 127.0.0.1, a client certificate from the same CA, and a client certificate from
another CA that the daemon must refuse.
"""

from __future__ import annotations

import concurrent.futures as cf
import shutil
import ssl
import subprocess
import threading
import time

import grpc
import httpx2 as httpx  # the OpenAI SDK's HTTP client (a dependency of openai)
import openai
import pytest

from daemon_harness import Daemon, WinnowClient, binary_path, build_health_probe, model_path

KEYS = ("team-a-0123456789", "team-b-9876543210")


@pytest.fixture(autouse=True, scope="module")
def _binary_and_model():
    if not binary_path().exists() or not model_path().exists():
        pytest.fail(f"need {binary_path()} and {model_path()} (make build model)")
    if shutil.which("openssl") is None:
        pytest.fail("the openssl command is needed to make test certificates "
                    "(scripts/install-deps.sh installs it)")


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")

    def openssl(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=d, timeout=60)

    def ca(name):
        openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                "-days", "2", "-subj", f"/CN={name} test CA", "-keyout", f"{name}.key",
                "-out", f"{name}.crt")

    def leaf(name, issuer, extensions):
        openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                "-subj", f"/CN={name}", "-keyout", f"{name}.key", "-out", f"{name}.csr")
        (d / f"{name}.ext").write_text(extensions)
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{issuer}.crt", "-CAkey",
                f"{issuer}.key", "-CAcreateserial", "-days", "2", "-extfile", f"{name}.ext",
                "-out", f"{name}.crt")

    ca("ca")
    ca("rogue")
    leaf("server", "ca", "subjectAltName=DNS:localhost,IP:127.0.0.1\n"
                         "extendedKeyUsage=serverAuth\n")
    leaf("client", "ca", "extendedKeyUsage=clientAuth\n")
    leaf("intruder", "rogue", "extendedKeyUsage=clientAuth\n")
    (d / "api-keys").write_text(f"# keys for the test\n{KEYS[0]}\n\n  {KEYS[1]}  \n")
    return d


def start_tls_daemon(pki, *extra: str) -> Daemon:
    d = Daemon("--tls-cert", str(pki / "server.crt"), "--tls-key", str(pki / "server.key"),
               *extra, wait=False)
    probe = WinnowClient(d.target, tls_ca=str(pki / "ca.crt"))
    deadline = time.monotonic() + 60
    try:
        while True:
            if d.proc.poll() is not None:
                raise RuntimeError(f"daemon exited with {d.proc.returncode}:\n{d.logs()}")
            try:
                if probe.health(timeout=1.0) == "SERVING":
                    return d
            except grpc.RpcError:
                pass
            if time.monotonic() > deadline:
                d.stop()
                raise TimeoutError(f"TLS daemon not SERVING after 60 s:\n{d.logs()}")
            time.sleep(0.1)
    finally:
        probe.close()


@pytest.fixture(scope="module")
def keyed(pki):
    """TLS and API keys."""
    d = start_tls_daemon(pki, "--api-key-file", str(pki / "api-keys"))
    yield d
    d.stop()


@pytest.fixture(scope="module")
def mutual(pki):
    """Mutual TLS, no API keys."""
    d = start_tls_daemon(pki, "--tls-client-ca", str(pki / "ca.crt"))
    yield d
    d.stop()


def https(d, pki, cert: tuple[str, str] | None = None) -> httpx.Client:
    context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    if cert:
        context.load_cert_chain(*cert)
    return httpx.Client(base_url=f"https://127.0.0.1:{d.http_port}", verify=context, timeout=60)


def code_of(call) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as err:
        call()
    return err.value


# ------------------------------------------------------------------------------------------
# TLS + API keys


def test_grpc_needs_tls_and_a_key_but_health_is_open(keyed, pki):
    assert "security tls=on client_certificates=off api_keys=2" in keyed.logs()
    with WinnowClient(keyed.target) as plain:  # plaintext against the TLS port
        assert code_of(lambda: plain.health(timeout=3)).code() == grpc.StatusCode.UNAVAILABLE

    with WinnowClient(keyed.target, tls_ca=str(pki / "ca.crt")) as anonymous:
        assert anonymous.health() == "SERVING"
        err = code_of(lambda: anonymous.generate_text("Hi", max_tokens=2))
        assert err.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "authorization: missing" in err.details()
        for call in (anonymous.model_info, anonymous.server_status,
                     lambda: anonymous.tokenize("Hi"), lambda: anonymous.detokenize([1])):
            assert code_of(call).code() == grpc.StatusCode.UNAUTHENTICATED

    with WinnowClient(keyed.target, tls_ca=str(pki / "ca.crt"), api_key="team-a") as wrong:
        err = code_of(lambda: wrong.generate_text("Hi", max_tokens=2))
        assert err.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "not a valid API key" in err.details()

    for key in KEYS:
        with WinnowClient(keyed.target, tls_ca=str(pki / "ca.crt"), api_key=key) as client:
            text, ids, final = client.generate_text("The capital of France is", max_tokens=4,
                                                    temperature=0.0, ignore_eos=True)
            assert len(ids) == 4 and final.usage.completion_tokens == 4
            assert client.model_info().num_layers > 0


def test_a_certificate_for_another_name_is_refused_by_the_client(keyed, pki):
    with WinnowClient(keyed.target, tls_ca=str(pki / "rogue.crt"), api_key=KEYS[0]) as c:
        assert code_of(lambda: c.health(timeout=3)).code() == grpc.StatusCode.UNAVAILABLE


def test_https_with_bearer_keys_and_open_health_and_metrics(keyed, pki):
    with https(keyed, pki) as web:
        assert web.get("/health").status_code == 200
        assert web.get("/metrics").status_code == 200
        r = web.get("/v1/models")
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        error = r.json()["error"]
        assert error["code"] == "invalid_api_key" and error["param"] == "authorization"
        r = web.post("/tokenize", json={"prompt": "Hi"}, headers={"Authorization": "Bearer x"})
        assert r.status_code == 401 and "not a valid API key" in r.json()["error"]["message"]
        r = web.get("/v1/models", headers={"Authorization": f"Bearer {KEYS[1]}"})
        assert r.status_code == 200 and r.json()["data"]

        metrics = web.get("/metrics").text
    from prometheus_client.parser import text_string_to_metric_families

    rejected = [s.value for f in text_string_to_metric_families(metrics) for s in f.samples
                if s.name == "winnow_requests_rejected_total"
                and s.labels.get("code") == "UNAUTHENTICATED"]
    assert rejected and rejected[0] >= 2, rejected
    # Plain HTTP to the HTTPS port gets no answer.
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{keyed.http_port}/health", timeout=5)


def test_openai_sdk_over_https(keyed, pki):
    http_client = httpx.Client(verify=ssl.create_default_context(cafile=str(pki / "ca.crt")))
    base = f"https://localhost:{keyed.http_port}/v1"
    sdk = openai.OpenAI(base_url=base, api_key=KEYS[0], http_client=http_client)
    model = sdk.models.list().data[0].id
    out = sdk.completions.create(model=model, prompt="The capital of France is", max_tokens=4,
                                 temperature=0)
    assert out.usage.completion_tokens == 4
    bad = openai.OpenAI(base_url=base, api_key="wrong", http_client=http_client, max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_health_probe_speaks_tls(keyed, pki, tmp_path):
    probe = build_health_probe(tmp_path)
    ok = subprocess.run([str(probe), "--addr", keyed.target, "--tls-ca", str(pki / "ca.crt")],
                        capture_output=True, text=True, timeout=30)
    assert ok.returncode == 0 and ok.stdout.strip() == "SERVING", ok.stderr
    by_name = subprocess.run([str(probe), "--addr", f"127.0.0.1:{keyed.port}", "--tls-ca",
                              str(pki / "ca.crt"), "--tls-server-name", "localhost"],
                             capture_output=True, text=True, timeout=30)
    assert by_name.returncode == 0, by_name.stderr
    plain = subprocess.run([str(probe), "--addr", keyed.target, "--timeout", "2"],
                           capture_output=True, text=True, timeout=30)
    assert plain.returncode == 1


# ------------------------------------------------------------------------------------------
# Mutual TLS


def test_mutual_tls_grpc(mutual, pki):
    assert "security tls=on client_certificates=required api_keys=0" in mutual.logs()
    ca = str(pki / "ca.crt")
    with WinnowClient(mutual.target, tls_ca=ca) as anonymous:
        assert anonymous.health() == "SERVING"  # probes need no certificate
        err = code_of(lambda: anonymous.generate_text("Hi", max_tokens=2))
        assert err.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "client certificate" in err.details()

    with WinnowClient(mutual.target, tls_ca=ca, tls_cert=str(pki / "client.crt"),
                      tls_key=str(pki / "client.key")) as client:
        _, ids, _ = client.generate_text("Hello", max_tokens=3, ignore_eos=True)
        assert len(ids) == 3

    # A certificate from another CA fails the handshake itself.
    with WinnowClient(mutual.target, tls_ca=ca, tls_cert=str(pki / "intruder.crt"),
                      tls_key=str(pki / "intruder.key")) as intruder:
        assert code_of(lambda: intruder.generate_text("Hi", max_tokens=2)).code() == \
            grpc.StatusCode.UNAVAILABLE


def test_mutual_tls_https(mutual, pki):
    with https(mutual, pki) as anonymous:
        assert anonymous.get("/health").status_code == 200
        assert anonymous.get("/v1/models").status_code == 401
    with https(mutual, pki, cert=(str(pki / "client.crt"), str(pki / "client.key"))) as client:
        assert client.get("/v1/models").status_code == 200
    with https(mutual, pki, cert=(str(pki / "intruder.crt"),
                                  str(pki / "intruder.key"))) as intruder:
        with pytest.raises(httpx.HTTPError):
            intruder.get("/health")


def test_bad_tls_files_stop_the_start(pki):
    d = Daemon("--tls-cert", str(pki / "server.crt"), "--tls-key", str(pki / "client.key"),
               wait=False)
    assert d.proc.wait(timeout=30) == 2
    assert "is not the key of --tls-cert" in d.logs()
    d.stop()
    d = Daemon("--api-key-file", str(pki / "absent"), wait=False)
    assert d.proc.wait(timeout=30) == 2
    assert "--api-key-file" in d.logs() and "cannot be read" in d.logs()
    d.stop()


# ------------------------------------------------------------------------------------------
# Per-connection limits


def test_max_concurrent_streams_queues_calls_on_one_connection():
    with Daemon("--max-concurrent-streams", "1") as d, WinnowClient(d.target) as watcher:
        def run():
            _, ids, _ = d.client.generate_text("Count:", max_tokens=48, ignore_eos=True)
            return len(ids)

        running = []
        with cf.ThreadPoolExecutor(2) as pool:
            calls = [pool.submit(run) for _ in range(2)]  # one channel, so one connection
            while not all(c.done() for c in calls):
                running.append(watcher.server_status().running)  # another connection
                time.sleep(0.02)
            assert [c.result() for c in calls] == [48, 48]
        # The engine would run both at once (max_seqs auto); the connection lets one through.
        assert max(running) == 1, running


def test_max_connection_age_sends_clients_away_and_they_reconnect():
    with Daemon("--max-connection-age", "1s", "--max-connection-age-grace", "30s") as d:
        states, idle = [], threading.Event()

        def watch(state):
            states.append(state)
            if state == grpc.ChannelConnectivity.IDLE and \
                    grpc.ChannelConnectivity.READY in states:
                idle.set()

        d.client.channel.subscribe(watch, try_to_connect=True)
        assert d.client.model_info().num_layers > 0
        # The server's GOAWAY after about a second takes the channel from READY back to IDLE.
        assert idle.wait(timeout=15), states
        assert d.client.model_info().num_layers > 0  # and the next call reconnects
        d.client.channel.unsubscribe(watch)
