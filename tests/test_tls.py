"""TLS served by TorchServe itself (eden_serve.serving.tls, .certificates): the checks of the files,
and one real TorchServe on loopback with a certificate from a CA made here, token auth on, and a
wire key, so that its encoder tags payloads and its DiT+decoder refuses untagged ones."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import pytest
import requests
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from eden_serve import wire
from eden_serve.client import Client
from eden_serve.client.tls import ClientTLS
from eden_serve.client.transports import read_token, warn_cleartext
from eden_serve.commands.cli import main
from eden_serve.config import PRESETS
from eden_serve.errors import BadInputError, UnreachableError
from eden_serve.model import synthetic
from eden_serve.serving.launcher import read_properties
from eden_serve.serving.tls import ServerTLS
from eden_serve.wire import keyed
from harness.certificates import Authority
from harness.servers import free_port, torchserve

WIRE_KEY = b"a shared key of thirty-two bytes"


@pytest.fixture(scope="module")
def authority(tmp_path_factory) -> Authority:
    return Authority.create(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def node_tls(authority) -> ServerTLS:
    return authority.issue("node", ["127.0.0.1"])


def pem_key(key, path, fmt=serialization.PrivateFormat.PKCS8):
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, fmt, serialization.NoEncryption()))
    return path


def test_the_key_must_be_pkcs8_rsa_and_match_the_certificate(authority, node_tls, tmp_path):
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    cases = {
        "traditional RSA": (pem_key(rsa_key, tmp_path / "a.key", serialization.PrivateFormat.TraditionalOpenSSL), "openssl pkcs8 -topk8"),
        "EC": (pem_key(ec.generate_private_key(ec.SECP256R1()), tmp_path / "b.key"), "not an RSA key"),
        "another RSA key": (pem_key(rsa_key, tmp_path / "c.key"), "do not go together"),
        "missing": (tmp_path / "none.key", "cannot read the TLS key"),
    }
    for name, (key, message) in cases.items():
        with pytest.raises(BadInputError, match=message):
            ServerTLS.from_files(node_tls.cert, key)
    with pytest.raises(BadInputError, match="no PEM CERTIFICATE"):
        ServerTLS.from_files(node_tls.key, node_tls.key)


def test_properties_make_every_address_https_and_grpc_tls(node_tls):
    settings = {"inference_address": "http://0.0.0.0:8080", "management_address": "HTTP://127.0.0.1:8081",
                "metrics_address": "https://0.0.0.0:8082", "job_queue_size": "8"}
    assert node_tls.properties(settings) == {
        "inference_address": "https://0.0.0.0:8080", "management_address": "https://127.0.0.1:8081",
        "metrics_address": "https://0.0.0.0:8082", "certificate_file": str(node_tls.cert),
        "private_key_file": str(node_tls.key), "enable_grpc_ssl": "true",
    }


def test_a_configuration_asks_for_tls_with_an_https_address(node_tls):
    assert ServerTLS.from_properties({"inference_address": "http://127.0.0.1:8080"}) is None
    with pytest.raises(BadInputError, match="needs certificate_file and private_key_file"):
        ServerTLS.from_properties({"inference_address": "https://127.0.0.1:8080"})
    with pytest.raises(BadInputError, match="not a keystore"):
        ServerTLS.from_properties({"inference_address": "https://127.0.0.1:8080", "keystore": "ks.p12"})
    found = ServerTLS.from_properties({"inference_address": "https://127.0.0.1:8080", "certificate_file": str(node_tls.cert),
                                       "private_key_file": str(node_tls.key)})
    assert found == node_tls


def test_a_missing_or_broken_ca_file_is_one_line(tmp_path):
    with pytest.raises(BadInputError, match="no such file"):
        ClientTLS.from_file(tmp_path / "none.pem")
    (tmp_path / "junk.pem").write_text("not a certificate\n")
    with pytest.raises(BadInputError, match="is not a PEM CA certificate"):
        ClientTLS.from_file(tmp_path / "junk.pem")


@pytest.mark.parametrize("arguments, message", [
    (["--tls-cert", "{cert}"], "--tls-cert and --tls-key go together"),
    (["--tls-cert", "{cert}", "--tls-key", "{cert}"], "holds CERTIFICATE, not one unencrypted PKCS#8 PRIVATE KEY"),
    (["--properties", "{https}"], "an https:// address needs certificate_file and private_key_file"),
    (["--wire-key-file", "{short}"], "fewer than 16"),
])
def test_serve_refuses_bad_tls_and_key_files_in_one_line_before_starting(node_tls, tmp_path, capsys, arguments, message):
    store = tmp_path / "store"
    store.mkdir()
    (store / "eden_ditdec.mar").touch()  # never opened: the files are refused first
    (tmp_path / "https.properties").write_text("inference_address=https://127.0.0.1:8443\n")
    (tmp_path / "short").write_text("0123\n")
    paths = {"cert": node_tls.cert, "https": tmp_path / "https.properties", "short": tmp_path / "short"}
    code = main(["serve", "edge", "--model-store", str(store), *(a.format(**paths) for a in arguments)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and message in err


@pytest.mark.serving
class TestServedOverTLS:
    @pytest.fixture(scope="class")
    @classmethod
    def server(cls, store, node_tls, tmp_path_factory):
        key_file = tmp_path_factory.mktemp("wire") / "key"
        key_file.write_bytes(WIRE_KEY + b"\n")
        with torchserve(store, models=["eden_encoder.mar", "eden_ditdec.mar"], tls=node_tls,
                        env={keyed.KEY_FILE_ENV: str(key_file)}) as server:
            yield server

    @pytest.fixture(scope="class")
    @classmethod
    def frames(cls, tmp_path_factory):
        folder = tmp_path_factory.mktemp("frames")
        paths = []
        for i, image in enumerate(synthetic.clip(2, 64, 96)):
            image.save(folder / f"{i}.png")
            paths.append(folder / f"{i}.png")
        return paths

    def client(self, server, authority, **options) -> Client:
        return Client(cloud=server.inference_url, edge=server.inference_url, token=server.keys["inference"],
                      tls=authority.client, **options)

    def test_every_address_is_https(self, server):
        assert all(url.startswith("https://127.0.0.1:") for url in (server.inference_url, server.management_url, server.metrics_url))

    def test_a_pair_crosses_https_with_a_tagged_payload(self, server, authority, frames):
        with self.client(server, authority) as client:
            middle = client.interpolate(*frames, seed=3)
        answer = requests.post(f"{server.inference_url}/predictions/eden_encoder", headers=server.inference_headers,
                               files={f"frame{i}": p.read_bytes() for i, p in enumerate(frames)},
                               verify=authority.client.verify, timeout=60)
        assert middle.size == (96, 64) and answer.status_code == 200
        assert answer.content[:8] == keyed.TAG_MAGIC
        assert bytes(keyed.verify(answer.content, WIRE_KEY))[:8] == wire.MAGIC

    def test_a_client_without_the_ca_gets_one_line_and_exit_2(self, server, frames, tmp_path, capsys):
        url, out = server.inference_url, tmp_path / "middle.png"
        code = main(["client", *map(str, frames), "-o", str(out), "--cloud", url, "--edge", url,
                     f"--token={server.keys['inference']}", "--tries", "3", "--backoff", "0.1"])
        err = capsys.readouterr().err
        assert code == 2 and not out.exists()
        assert err.count("\n") == 1 and "Traceback" not in err
        assert "certificate verify failed: unable to get local issuer certificate" in err and "--cacert" in err

    def test_a_certificate_for_another_name_is_refused_the_same_way(self, server, authority, frames):
        other = server.inference_url.replace("127.0.0.1", "localhost")  # the certificate names 127.0.0.1 only
        with Client(cloud=other, edge=other, token=server.keys["inference"], tls=authority.client) as client:
            with pytest.raises(UnreachableError, match="verify failed: .*mismatch.*not trusted"):
                client.interpolate(*frames)

    def test_plain_http_is_refused(self, server):
        answer = requests.get(server.inference_url.replace("https://", "http://") + "/ping", timeout=10)
        assert answer.status_code == 403 and "only accepts HTTPS" in answer.json()["status"]

    def test_grpc_serves_tls_with_the_same_certificate(self, server, authority, node_tls):
        port = int(read_properties(server.workdir / "config.properties")["grpc_inference_port"])
        context = authority.client.ssl_context()
        context.set_alpn_protocols(["h2"])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
            with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                assert tls.selected_alpn_protocol() == "h2"
                assert tls.getpeercert(binary_form=True) == node_tls.cert_der()

    def test_the_launcher_talks_only_to_the_certificate_it_gave(self, server, authority):
        assert server.models() == ["eden_ditdec", "eden_encoder"]
        stranger = authority.issue("stranger", ["127.0.0.1"]).pinned_session()
        with pytest.raises(requests.exceptions.SSLError, match="[Ff]ingerprint"):
            stranger.get(f"{server.management_url}/models", headers=server.management_headers, timeout=10)

    def test_a_forged_payload_with_a_correct_digest_is_refused_with_403(self, server, authority):
        config = PRESETS["tiny"]
        forged = wire.encode(synthetic.chunk(config, (64, 96)), config)  # a correct BLAKE2b digest, no key
        wrong_key = keyed.sign(forged, WIRE_KEY[::-1])
        for body in (forged, wrong_key):
            answer = requests.post(f"{server.inference_url}/predictions/eden_ditdec", data=body, verify=authority.client.verify,
                                   headers={**server.inference_headers, "Content-Type": "application/octet-stream"}, timeout=60)
            assert answer.status_code == 403, answer.text
            assert answer.json()["type"] == "unauthentic_payload"


@pytest.mark.serving
def test_serve_with_a_certificate_and_a_wire_key_serves_https_and_refuses_untagged_payloads(store, authority, node_tls,
                                                                                           tmp_path):
    """``eden-serve serve edge --tls-cert --tls-key --wire-key-file``, the container's process: its
    ready line names https:// addresses, a client with the CA reaches it, and its workers got the key."""
    local = tmp_path / "local.properties"
    ports = {name: free_port() for name in ("inference", "management", "metrics")}
    local.write_text("".join(f"{name}_address=http://127.0.0.1:{port}\n" for name, port in ports.items()))
    (tmp_path / "wire.key").write_bytes(WIRE_KEY)
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "eden_serve.commands.cli", "serve", "edge", "--model-store", str(store), "--properties", str(local),
             "--tls-cert", str(node_tls.cert), "--tls-key", str(node_tls.key), "--wire-key-file", str(tmp_path / "wire.key")],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 300
        while "eden-serve: edge ready" not in log.read_text(errors="replace"):
            assert process.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
            time.sleep(0.5)
        url = f"https://127.0.0.1:{ports['inference']}"
        assert f"inference {url}" in log.read_text()
        key_file = next(line for line in log.read_text().splitlines() if "edge ready" in line).split("keys in ")[1].strip()
        headers = {"Authorization": f"Bearer {read_token(token_file=key_file)}"}
        assert requests.get(f"{url}/ping", headers=headers, verify=authority.client.verify, timeout=10).json() == {"status": "Healthy"}
        config = PRESETS["tiny"]
        answer = requests.post(f"{url}/predictions/eden_ditdec", data=wire.encode(synthetic.chunk(config, (64, 96)), config),
                               headers={**headers, "Content-Type": "application/octet-stream"},
                               verify=authority.client.verify, timeout=60)
        assert answer.status_code == 403 and answer.json()["type"] == "unauthentic_payload"
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_a_short_or_shared_key_is_refused_and_a_readable_one_warned_about(node_tls, tmp_path):
    short = pem_key(rsa.generate_private_key(public_exponent=65537, key_size=1024), tmp_path / "short.key")
    short.chmod(0o600)
    with pytest.raises(BadInputError, match="RSA key of 1024 bits, fewer than 2048"):
        ServerTLS.from_files(node_tls.cert, short)
    shared = tmp_path / "shared.key"
    shared.write_bytes(node_tls.key.read_bytes())
    shared.chmod(0o666)
    with pytest.raises(BadInputError, match="may be written by other users"):
        ServerTLS.from_files(node_tls.cert, shared)
    shared.chmod(0o644)
    with pytest.warns(UserWarning, match="is readable by other users"):
        ServerTLS.from_files(node_tls.cert, shared)
    shared.chmod(0o640)
    ServerTLS.from_files(node_tls.cert, shared)  # a group that may read it (a Kubernetes secret's 0440) is the operator's choice


@pytest.mark.parametrize("url, warned", [("http://127.0.0.1:8080", False), ("grpc://[::1]:7070", False), ("http://localhost:1", False),
                                         ("https://edge.example", False), ("http://edge.example:8080", True),
                                         ("grpc://10.1.2.3:7070", True)])
def test_a_token_in_clear_to_another_host_is_warned_about_in_one_line(url, warned, recwarn):
    warn_cleartext(url, "secret")
    warn_cleartext(url, None)  # no token: nothing to say
    assert [str(w.message).split(", which")[0] for w in recwarn] == ([f"the token goes in clear to {url}"] if warned else [])
