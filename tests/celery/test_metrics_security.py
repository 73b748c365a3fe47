"""The metrics port lets no one in uninvited: TLS (with client certificates), basic auth, and a
bound on tenant series whatever the tasks' arguments (governor.celery.metrics.server)."""

from __future__ import annotations

import base64
import logging
import shutil
import ssl
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery
from prometheus_client.parser import text_string_to_metric_families

from governor import ConfigError
from governor.celery import metrics, signals
from governor.celery.config.settings import load_settings
from governor.embedded import free_port


@pytest.fixture
def uninstall() -> Iterator[None]:
    yield
    metrics.uninstall()


def fetch(url: str, context: ssl.SSLContext | None = None, auth: str | None = None) -> str:
    request = urllib.request.Request(url)
    if auth is not None:
        request.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    with urllib.request.urlopen(request, timeout=5, context=context) as response:
        return str(response.read().decode())


def test_tenant_series_are_bounded(uninstall: None, caplog: pytest.LogCaptureFixture) -> None:
    """A flood of distinct tenants makes at most ``tenants`` series of their own; the rest
    count under tenant="other", with one warning."""
    port = free_port()
    metrics.install(object(), port, "127.0.0.1", multiprocess=False, tenants=5)
    with caplog.at_level(logging.WARNING, logger="governor.celery.metrics"):
        for n in range(500):
            signals.task_admitted.send(
                sender=None,
                request=None,
                limits=["queue:r"],
                waits=1,
                fair=("queue:r", f"t{n}", 0.1),
            )
    text = fetch(f"http://127.0.0.1:{port}/metrics")
    counts = {
        s.labels["tenant"]: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "governor_tenant_wait_seconds_count"
    }
    assert set(counts) == {"t0", "t1", "t2", "t3", "t4", "other"}
    assert counts["other"] == 495
    assert caplog.text.count("more than 5 tenants") == 1


def test_basic_auth_is_required(uninstall: None) -> None:
    port = free_port()
    guard = metrics.Protection(basic_auth=("prom", "s3cret:with:colons"))
    metrics.install(object(), port, "127.0.0.1", multiprocess=False, protection=guard)
    url = f"http://127.0.0.1:{port}/metrics"
    for auth in (None, "prom:wrong", "other:s3cret:with:colons"):
        with pytest.raises(urllib.error.HTTPError) as denied:
            fetch(url, auth=auth)
        assert denied.value.code == 401
    assert "governor_admitted_total" in fetch(url, auth="prom:s3cret:with:colons")
    assert "s3cret" not in repr(guard)


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, made with openssl."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    d = tmp_path_factory.mktemp("pki")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test CA",
             "-keyout", str(d / "ca.key"), "-out", str(d / "ca.pem"))  # fmt: skip
    (d / "san.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    for name, extra in (("server", ["-extfile", str(d / "san.cnf")]), ("client", [])):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
                 "-keyout", str(d / f"{name}.key"), "-out", str(d / f"{name}.csr"))  # fmt: skip
        _openssl("x509", "-req", "-in", str(d / f"{name}.csr"), "-CA", str(d / "ca.pem"),
                 "-CAkey", str(d / "ca.key"), "-CAcreateserial", "-days", "2",
                 "-out", str(d / f"{name}.pem"), *extra)  # fmt: skip
    return d


def test_tls_with_client_certificates(uninstall: None, certificates: Path) -> None:
    d = certificates
    port = free_port()
    guard = metrics.Protection(
        certfile=str(d / "server.pem"),
        keyfile=str(d / "server.key"),
        client_cafile=str(d / "ca.pem"),
    )
    metrics.install(object(), port, "127.0.0.1", multiprocess=False, protection=guard)
    url = f"https://127.0.0.1:{port}/metrics"
    client = ssl.create_default_context(cafile=str(d / "ca.pem"))
    client.load_cert_chain(str(d / "client.pem"), str(d / "client.key"))
    assert "governor_admitted_total" in fetch(url, client)
    anonymous = ssl.create_default_context(cafile=str(d / "ca.pem"))
    with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
        fetch(url, anonymous)  # no client certificate: refused in the handshake
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        fetch(f"http://127.0.0.1:{port}/metrics")  # plain HTTP gets no metrics


def test_metrics_settings_are_checked_and_secrets_stay_hidden() -> None:
    def settings(**conf: object) -> object:
        app = Celery("m", broker="redis://127.0.0.1:1/0", set_as_current=False)
        app.conf.update(conf)
        return load_settings(app.conf)

    with pytest.raises(ConfigError, match="go together"):
        settings(governor_metrics_certfile="/x.pem")
    with pytest.raises(ConfigError, match="needs TLS"):
        settings(governor_metrics_client_cafile="/ca.pem")
    with pytest.raises(ConfigError, match="governor_metrics_basic_auth") as bad:
        settings(governor_metrics_basic_auth="no-colon-s3cret")
    assert "s3cret" not in str(bad.value)
    loaded = settings(governor_metrics_basic_auth="prom:s3cret", governor_metrics_tenants=True)
    assert "s3cret" not in repr(loaded)
    assert loaded.metrics_tenants == 100  # type: ignore[attr-defined]
    assert loaded.metrics_basic_auth == ("prom", "s3cret")  # type: ignore[attr-defined]
