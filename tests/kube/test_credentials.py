"""Where a transport's credentials come from, and which path builds it: the TLS settings of a
kubeconfig's cluster and user (real TLS, a CA, a server and a client certificate made on
the spot) give the same outcome on both paths; plugins and proxies go to the kubernetes
package; the in-cluster service account, its token read again as the kubelet rotates it
(on an injected clock) and at once after a 401; and a kubeconfig localpv cannot use is one
line that says why."""

from __future__ import annotations

import base64
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from localpv.clock import ManualClock
from localpv.kube import errors
from localpv.kube.api import KubeApi
from localpv.kube.client import ClientConfigError, make_api_client
from localpv.kube.errors import NO_RETRY, ApiError
from localpv.kube.resources import CONFIG_MAPS
from localpv.kube.transport import TOKEN_FILE_PERIOD, Transport
from tests.kube.kubeconfigs import TOKEN, built_with, transport_from, write_kubeconfig
from tests.kube.pki import CLIENT_CN, SERVER_NAME, Pki, make_pki
from tests.kube.scripted import Reply, ScriptedServer, status_body

CM = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": "default"}}


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def tls_srv(pki: Pki) -> Iterator[ScriptedServer]:
    with ScriptedServer(tls=pki.server_context()) as server:
        yield server


@pytest.fixture(autouse=True)
def _no_proxy_or_override(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy", "NO_PROXY",
                 "no_proxy", "LOCALPV_KUBE_TRANSPORT", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
        monkeypatch.delenv(name, raising=False)


def b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def get(transport: Transport) -> dict[str, Any]:
    return KubeApi(transport, backoff=NO_RETRY, timeout=5.0).get(CONFIG_MAPS, "x", "default")


# ---------------------------------------------------------------- TLS, on both paths


def tls_case(pki: Pki, case: str, port: int) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """(server, cluster keys, user keys) of a named case."""
    ip, localhost = f"https://127.0.0.1:{port}", f"https://localhost:{port}"
    ca = {"certificate-authority": str(pki.ca)}
    client_files = {"client-certificate": str(pki.client_cert), "client-key": str(pki.client_key)}
    return {
        "CA file": (ip, ca, {"token": TOKEN}),
        "CA data": (ip, {"certificate-authority-data": b64(pki.ca)}, {"token": TOKEN}),
        "tls-server-name": (localhost, {**ca, "tls-server-name": SERVER_NAME}, {"token": TOKEN}),
        "insecure-skip-tls-verify": (localhost, {"insecure-skip-tls-verify": True}, {"token": TOKEN}),
        "client certificate files": (ip, ca, client_files),
        "client certificate data": (ip, ca, {"client-certificate-data": b64(pki.client_cert),
                                             "client-key-data": b64(pki.client_key)}),
        "token and client certificate": (ip, ca, {"token": TOKEN, **client_files}),
        "a name the certificate lacks": (localhost, ca, {"token": TOKEN}),
        "a wrong tls-server-name": (ip, {**ca, "tls-server-name": "other.example"}, {"token": TOKEN}),
        "no CA: the system's roots": (ip, {}, {"token": TOKEN}),
        "a client certificate of another CA": (ip, ca, {"client-certificate": str(pki.stranger_cert),
                                                        "client-key": str(pki.stranger_key)}),
    }[case]


#: case -> (answered, the client certificate's name the server saw, the Authorization header)
TLS_CASES: dict[str, tuple[bool, str | None, str | None]] = {
    "CA file": (True, None, f"Bearer {TOKEN}"),
    "CA data": (True, None, f"Bearer {TOKEN}"),
    "tls-server-name": (True, None, f"Bearer {TOKEN}"),
    "insecure-skip-tls-verify": (True, None, f"Bearer {TOKEN}"),
    "client certificate files": (True, CLIENT_CN, None),
    "client certificate data": (True, CLIENT_CN, None),
    "token and client certificate": (True, CLIENT_CN, f"Bearer {TOKEN}"),
    "a name the certificate lacks": (False, None, None),
    "a wrong tls-server-name": (False, None, None),
    "no CA: the system's roots": (False, None, None),
    "a client certificate of another CA": (False, None, None),
}


@pytest.mark.parametrize("case", list(TLS_CASES))
def test_a_kubeconfigs_tls_settings_mean_the_same_on_both_paths(pki: Pki, tls_srv: ScriptedServer, tmp_path: Path,
                                                                transport_kind: str, case: str) -> None:
    answered, cn, authorization = TLS_CASES[case]
    server, cluster, user = tls_case(pki, case, tls_srv.port)
    transport = transport_from(transport_kind, write_kubeconfig(tmp_path / "kc", server, cluster=cluster, user=user))
    tls_srv.script(Reply(200, CM))
    if not answered:
        with pytest.raises(errors.Retryable) as caught:
            get(transport)
        assert caught.value.status == 0 and "SSL" in str(caught.value), "a TLS failure is a transport error"
        assert tls_srv.requests == []
        return
    assert get(transport)["metadata"]["name"] == "x"
    (request,) = tls_srv.requests
    assert request.client_cn == cn
    assert request.headers.get("authorization") == authorization


def test_certificate_data_leaves_no_file_behind(pki: Pki, tls_srv: ScriptedServer, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The key goes through an anonymous memory file; where there is none, through a
    private temporary file removed right after loading. Neither stays."""
    user = {"client-certificate-data": b64(pki.client_cert), "client-key-data": b64(pki.client_key)}
    kubeconfig = write_kubeconfig(tmp_path / "kc", tls_srv.url, cluster={"certificate-authority": str(pki.ca)},
                                  user=user)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    seen: list[int] = []
    real_load = __import__("ssl").SSLContext.load_cert_chain

    def spy(self: Any, certfile: str, *args: Any, **kwargs: Any) -> None:
        if not certfile.startswith("/proc/"):
            seen.append(os.stat(certfile).st_mode & 0o777)
        real_load(self, certfile, *args, **kwargs)

    monkeypatch.setattr("ssl.SSLContext.load_cert_chain", spy)
    for memfd in (True, False):
        if not memfd:
            monkeypatch.delattr(os, "memfd_create")
        tls_srv.script(Reply(200, CM))
        assert get(transport_from("localpv", kubeconfig))["metadata"]["name"] == "x"
        assert tls_srv.requests[-1].client_cn == CLIENT_CN
        assert list(scratch.iterdir()) == []
    assert seen == [0o600], "one private temporary file, when there was no memory file"


# ---------------------------------------------------------------- which path


def exec_user(token: str) -> dict[str, Any]:
    credential = {"apiVersion": "client.authentication.k8s.io/v1beta1", "kind": "ExecCredential",
                  "status": {"token": token}}
    return {"exec": {"apiVersion": "client.authentication.k8s.io/v1beta1", "command": sys.executable,
                     "args": ["-c", f"import json; print(json.dumps({credential!r}))"],
                     "interactiveMode": "Never"}}


@pytest.mark.parametrize(("user", "kind", "authorization"), [
    ({}, "localpv", None),
    ({"token": "abc"}, "localpv", "Bearer abc"),
    ({"tokenFile": "token"}, "localpv", "Bearer from-file"),
    (exec_user("from-plugin"), "kubernetes", "Bearer from-plugin"),
    ({"username": "u", "password": "p"}, "kubernetes", "Basic " + base64.b64encode(b"u:p").decode()),
], ids=["anonymous", "token", "tokenFile", "exec plugin", "basic auth"])
def test_the_credentials_choose_the_path_and_are_sent(tmp_path: Path, user: dict[str, Any], kind: str,
                                                      authorization: str | None) -> None:
    (tmp_path / "token").write_text("from-file\n")  # relative to the kubeconfig's directory
    with ScriptedServer() as srv:
        transport = make_api_client(str(write_kubeconfig(tmp_path / "kc", srv.url, user=user)))
        assert built_with(transport) == kind
        srv.script(Reply(200, CM))
        get(transport)
        assert srv.requests[0].headers.get("authorization") == authorization


def test_a_proxy_goes_to_the_kubernetes_package_unless_no_proxy_lists_the_server(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kubeconfig = str(write_kubeconfig(tmp_path / "kc", "https://api.example:6443", user={"token": "t"}))
    assert built_with(make_api_client(kubeconfig)) == "localpv"
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    assert built_with(make_api_client(kubeconfig)) == "kubernetes"
    monkeypatch.setenv("NO_PROXY", "api.example")
    assert built_with(make_api_client(kubeconfig)) == "localpv"
    proxied = write_kubeconfig(tmp_path / "kc2", "https://api.example:6443", user={"token": "t"},
                               cluster={"proxy-url": "http://proxy.example:3128"})
    assert built_with(make_api_client(str(proxied))) == "kubernetes"


def test_the_environment_can_send_every_kubeconfig_through_the_kubernetes_package(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kubeconfig = str(write_kubeconfig(tmp_path / "kc", "https://api.example:6443", user={"token": "t"}))
    monkeypatch.setenv("LOCALPV_KUBE_TRANSPORT", "kubernetes")
    assert built_with(make_api_client(kubeconfig)) == "kubernetes"
    monkeypatch.setenv("LOCALPV_KUBE_TRANSPORT", "urllib")
    with pytest.raises(ClientConfigError) as caught:
        make_api_client(kubeconfig)
    assert "LOCALPV_KUBE_TRANSPORT" in str(caught.value) and "urllib" in str(caught.value)


def test_kubeconfig_files_merge_as_kubectl_merges_them(tmp_path: Path) -> None:
    with ScriptedServer() as srv:
        first = tmp_path / "a" / "config"
        first.parent.mkdir()
        first.write_text(yaml.safe_dump({
            "current-context": "main",
            "contexts": [{"name": "main", "context": {"cluster": "c", "user": "u"}}],
            "clusters": [{"name": "c", "cluster": {"server": srv.url}}]}))
        second = tmp_path / "b" / "config"
        second.parent.mkdir()
        (second.parent / "token").write_text("second-file-token")
        second.write_text(yaml.safe_dump({
            "current-context": "other",
            "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:1"}}],
            "users": [{"name": "u", "user": {"tokenFile": "token"}}]}))
        transport = make_api_client(f"{first}:{tmp_path / 'missing'}:{second}")
        srv.script(Reply(200, CM))
        get(transport)
        assert srv.requests[0].headers["authorization"] == "Bearer second-file-token", \
            "the first file's context and cluster, the second's user, its token file relative to it"


# ---------------------------------------------------------------- what cannot be used


@pytest.mark.parametrize(("doc", "words"), [
    ({"clusters": [], "contexts": []}, "current-context"),
    ({"current-context": "x", "contexts": []}, "context named 'x'"),
    ({"current-context": "x", "contexts": [{"name": "x", "context": {"cluster": "c"}}]}, "cluster named 'c'"),
    ({"current-context": "x", "contexts": [{"name": "x", "context": {"cluster": "c"}}],
      "clusters": [{"name": "c", "cluster": {}}]}, "expected a server"),
    ({"current-context": "x", "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
      "clusters": [{"name": "c", "cluster": {"server": "https://a.example"}}],
      "users": [{"name": "u", "user": {"client-certificate-data": "QUJD"}}]}, "client-key"),
    ({"current-context": "x", "contexts": [{"name": "x", "context": {"cluster": "c"}}],
      "clusters": [{"name": "c", "cluster": {"server": "https://a.example",
                                             "certificate-authority-data": "not base64!"}}]}, "base64"),
    ({"current-context": "x", "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
      "clusters": [{"name": "c", "cluster": {"server": "https://a.example"}}],
      "users": [{"name": "u", "user": {"tokenFile": "absent"}}]}, "tokenFile"),
    ({"current-context": "x", "contexts": "x"}, "contexts to be a list"),
], ids=["no current-context", "no such context", "no such cluster", "no server", "a certificate without its key",
        "CA data not base64", "a token file that is not there", "contexts not a list"])
def test_a_kubeconfig_localpv_cannot_use_is_one_line_that_says_why(tmp_path: Path, doc: dict[str, Any],
                                                                   words: str) -> None:
    path = tmp_path / "kc"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(ClientConfigError) as caught:
        make_api_client(str(path))
    assert caught.value.kubeconfig == str(path)
    assert words in caught.value.problem and "\n" not in caught.value.problem
    assert caught.value.problem.startswith("expected a usable kubeconfig, found: ")


# ---------------------------------------------------------------- in-cluster


@pytest.fixture
def service_account(pki: Pki, tls_srv: ScriptedServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A pod's service-account directory and environment, for the scripted server."""
    directory = tmp_path / "serviceaccount"
    directory.mkdir()
    (directory / "token").write_text("token-1")
    (directory / "ca.crt").write_bytes(pki.ca.read_bytes())
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(tls_srv.port))
    monkeypatch.setenv("LOCALPV_SERVICEACCOUNT_DIR", str(directory))
    return directory


def test_in_cluster_credentials_on_both_paths(service_account: Path, tls_srv: ScriptedServer,
                                              transport_kind: str) -> None:
    transport = make_api_client(None, transport="kubernetes" if transport_kind == "kubernetes" else "auto")
    assert built_with(transport) == transport_kind and transport.server == f"https://127.0.0.1:{tls_srv.port}"
    tls_srv.script(Reply(200, CM))
    get(transport)
    assert tls_srv.requests[0].headers["authorization"].lower() == "bearer token-1"


def test_the_service_account_token_is_read_again_once_a_minute(service_account: Path,
                                                               tls_srv: ScriptedServer) -> None:
    clock = ManualClock()
    api = KubeApi(make_api_client(None, clock=clock), backoff=NO_RETRY)
    tls_srv.script(*[Reply(200, CM)] * 3)
    api.get(CONFIG_MAPS, "x", "default")
    (service_account / "token").write_text("token-2\n")  # the kubelet rotated it
    clock.advance(TOKEN_FILE_PERIOD - 1)
    api.get(CONFIG_MAPS, "x", "default")
    clock.advance(1)
    api.get(CONFIG_MAPS, "x", "default")
    assert [r.headers["authorization"] for r in tls_srv.requests] == ["Bearer token-1", "Bearer token-1",
                                                                      "Bearer token-2"]


def test_a_401_reads_the_token_again_at_once_and_sends_the_request_once_more(service_account: Path,
                                                                              tls_srv: ScriptedServer) -> None:
    seen: list[ApiError | None] = []
    api = KubeApi(make_api_client(None, clock=ManualClock()), backoff=NO_RETRY,
                  observer=lambda verb, res, seconds, err: seen.append(err))
    (service_account / "token").write_text("token-2")
    tls_srv.script(Reply(401, status_body(401, "Unauthorized")), Reply(200, CM))
    assert api.get(CONFIG_MAPS, "x", "default")["metadata"]["name"] == "x"
    assert [r.headers["authorization"] for r in tls_srv.requests] == ["Bearer token-1", "Bearer token-2"]
    assert seen == [None], "one request, answered"
    # The same token again: the 401 stands, and nothing is sent twice.
    tls_srv.script(Reply(401, status_body(401, "Unauthorized")))
    with pytest.raises(errors.Permanent):
        api.get(CONFIG_MAPS, "x", "default")
    assert len(tls_srv.requests) == 3


def test_a_token_file_that_cannot_be_read_again_keeps_the_token_in_hand(service_account: Path,
                                                                        tls_srv: ScriptedServer) -> None:
    clock = ManualClock()
    api = KubeApi(make_api_client(None, clock=clock), backoff=NO_RETRY)
    (service_account / "token").unlink()
    clock.advance(TOKEN_FILE_PERIOD)
    tls_srv.script(Reply(200, CM))
    api.get(CONFIG_MAPS, "x", "default")
    assert tls_srv.requests[0].headers["authorization"] == "Bearer token-1"


@pytest.mark.parametrize("missing", ["token", "ca.crt"])
def test_an_incomplete_service_account_is_one_line(service_account: Path, missing: str) -> None:
    (service_account / missing).unlink()
    with pytest.raises(ClientConfigError) as caught:
        make_api_client(None)
    assert caught.value.kubeconfig is None and "\n" not in str(caught.value)
    assert str(service_account / missing) in str(caught.value) and "in-cluster service account" in str(caught.value)
