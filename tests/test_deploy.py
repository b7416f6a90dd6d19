"""The deployment files: the container entrypoint (run here, without Docker), the Dockerfile (hadolint),
the Kubernetes overlays (kubectl kustomize, the Kubernetes JSON schemas) and the KServe manifests.

Each checker comes from a package of the deploy-check extra, so no Docker engine and no cluster is needed.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from importlib.resources import files
from pathlib import Path

import jsonschema
import kubernetes_validate
import numpy as np
import pytest
import requests
import torch
import yaml
from referencing import Registry, Resource

from eden_serve.client import Client
from eden_serve.clips.pipeline import interpolate_pair
from eden_serve.commands.cli import main
from eden_serve.media.frames import load_frame, to_uint8
from eden_serve.model.checkpoint import load_archived
from eden_serve.serving.archive import GLUE
from eden_serve.serving.launcher import BASE_CONFIG, NO_URLS, read_properties
from harness.servers import REPO, build_archives, free_port, set_handler

DEPLOY = REPO / "deploy"
ENTRYPOINT = DEPLOY / "docker" / "entrypoint.sh"
CLUSTER_PROPERTIES = DEPLOY / "kubernetes" / "config" / "serve.properties"
BIN = Path(sys.executable).parent


# --- the entrypoint, serving -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    # One thread per worker (archive.sh --threads), so the in-process oracle can match it exactly.
    return build_archives(tmp_path_factory.mktemp("model_store"), config="tiny", threads=1)


def wait_for_line(log: Path, text: str, process: subprocess.Popen, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = [line for line in log.read_text(errors="replace").splitlines() if text in line]
        if lines:
            return lines[0]
        if process.poll() is not None:
            pytest.fail(f"the entrypoint exited with {process.returncode}:\n{log.read_text(errors='replace')[-4000:]}")
        time.sleep(0.5)
    pytest.fail(f"no {text!r} within {timeout:.0f} s:\n{log.read_text(errors='replace')[-4000:]}")


def stop(process: subprocess.Popen) -> int:
    """SIGTERM, as Kubernetes stops a container; SIGINT, then SIGKILL only if that is ignored."""
    for sig, grace in ((signal.SIGTERM, 120), (signal.SIGINT, 60), (signal.SIGKILL, 10)):
        if process.poll() is not None:
            break
        process.send_signal(sig)
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            continue
    return process.returncode


@pytest.mark.serving
def test_entrypoint_serves_from_another_directory_and_stops_on_sigterm(store, tmp_path):
    """The image's entrypoint, started elsewhere with the cluster's properties: a real prediction,
    no token needed (token authorization is off in the cluster), then SIGTERM stops TorchServe."""
    ports = {name: free_port() for name in ("inference", "management", "metrics")}
    local = tmp_path / "local.properties"  # loopback and free ports over the cluster's addresses
    local.write_text("".join(f"{name}_address=http://127.0.0.1:{port}\n" for name, port in ports.items())
                     + "".join(f"grpc_{api}_port={free_port()}\n" for api in ("inference", "management")))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    log = tmp_path / "entrypoint.log"
    # PATH without the project's environment: the entrypoint finds it from its own location. HOME
    # must stay untouched, as in the pods (read-only root file system; /tmp and /models writable).
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "PATH": "/usr/bin:/bin", "HOME": str(home)}
    with open(log, "wb") as out:
        process = subprocess.Popen(
            ["bash", str(ENTRYPOINT), "serve", "both", "--model-store", str(store),
             "--properties", str(CLUSTER_PROPERTIES), "--properties", str(local)],
            cwd=elsewhere, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        ready = wait_for_line(log, "eden-serve: both ready", process, timeout=300)
        assert "token authorization off" in ready
        url = f"http://127.0.0.1:{ports['inference']}"
        ping = requests.get(f"{url}/ping", timeout=10)
        assert ping.status_code == 200 and ping.json() == {"status": "Healthy"}

        frame0, frame1 = REPO / "examples" / "frame0.png", REPO / "examples" / "frame1.png"
        with Client(cloud=url, edge=url) as client:
            served = np.asarray(client.interpolate(frame0, frame1, seed=5))

        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            expected, _ = interpolate_pair(
                *load_archived(store),
                load_frame(frame0), load_frame(frame1), seed=5,
            )
        finally:
            torch.set_num_threads(threads)
        assert np.array_equal(served, to_uint8(expected))
        assert not list(elsewhere.iterdir()) and not list(home.iterdir()), "the entrypoint wrote outside /tmp"
    finally:
        code = stop(process)
    assert code == 143, log.read_text(errors="replace")[-4000:]
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://127.0.0.1:{ports['inference']}/ping", timeout=5)


def test_serve_without_archives_is_one_line_and_exit_2(tmp_path):
    result = subprocess.run(
        ["bash", str(ENTRYPOINT), "serve", "edge", "--model-store", str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"eden-serve: error: no eden_ditdec.mar in {tmp_path}; build the archives (archive.sh), or pass --checkpoint"
    ]


def test_serve_refuses_an_archive_whose_handler_settings_no_worker_loads(store, tmp_path, capsys):
    """Judged before TorchServe starts, as its workers would judge them; before, every worker
    failed as it loaded, TorchServe loaded it again and again, and the node said so only at its
    startup timeout, in a line of TorchServe's access log."""
    mine = tmp_path / "store"
    mine.mkdir()
    shutil.copy(store / "eden_ditdec.mar", mine)
    set_handler(mine / "eden_ditdec.mar", {"max_pixels": 0})
    local = tmp_path / "local.properties"  # free ports, for a node that does start
    local.write_text("".join(f"{name}_address=http://127.0.0.1:{free_port()}\n" for name in ("inference", "management", "metrics"))
                     + "".join(f"grpc_{api}_port={free_port()}\n" for api in ("inference", "management")))
    code = main(["serve", "edge", "--model-store", str(mine), "--properties", str(local), "--startup-timeout", "30"])
    assert code == 2
    assert capsys.readouterr().err.splitlines() == [
        f"eden-serve: error: {mine / 'eden_ditdec.mar'}: model-config.yaml: handler.max_pixels must be an integer >= 1, got 0"
    ]


def test_serve_takes_a_media_root_only_for_archives_it_builds(tmp_path):
    result = subprocess.run(
        ["bash", str(ENTRYPOINT), "serve", "cloud", "--model-store", str(tmp_path), "--media-root", "/media"],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "eden-serve: error: --media-root is written into the archives built at start: give --checkpoint or --synthetic, "
        "or build the archives with eden-serve archive --media-root"
    ]


def test_serve_refuses_a_wrong_checkpoint_before_building(tmp_path):
    checkpoint = tmp_path / "eden.pt"
    checkpoint.write_bytes(b"junk")
    result = subprocess.run(
        ["bash", str(ENTRYPOINT), "serve", "edge", "--model-store", str(tmp_path / "store"), "--checkpoint", str(checkpoint)],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1
    assert "not a PyTorch checkpoint" in result.stderr
    assert not (tmp_path / "store").exists()


def test_no_configuration_lets_a_url_register():
    """The base configuration refuses every archive URL, and the files laid over it (the container's,
    the cluster's) leave that alone; the launcher enforces it besides (tests/test_hostile_requests.py)."""
    assert read_properties(BASE_CONFIG)["allowed_urls"] == NO_URLS
    for overlay in (DEPLOY / "docker" / "container.properties", CLUSTER_PROPERTIES):
        assert "allowed_urls" not in read_properties(overlay), overlay


def test_workflow_nodes_wait_as_long_as_their_models_can_take():
    """A node's timeout covers a full queue ahead of it (two batches) and its own batch, each within
    its archive's responseTimeout; no retries inside the workflow (the client retries)."""
    spec = yaml.safe_load((GLUE / "eden.yaml").read_text())["models"]
    queue = int(read_properties(BASE_CONFIG)["job_queue_size"])
    assert spec["retry-attempts"] == 0
    for name in ("eden_encoder", "eden_ditdec"):
        archive = yaml.safe_load((GLUE / f"{name}-config.yaml").read_text())
        assert spec["batch-size"] == archive["batchSize"]
        batches = 1 + math.ceil(queue / archive["batchSize"])
        assert spec[name]["timeout-ms"] == batches * archive["responseTimeout"] * 1000, name


# --- the Dockerfile --------------------------------------------------------------------------------


def tool(name: str) -> str:
    path = BIN / name
    if not path.exists():
        pytest.fail(f"{name} is missing: run setup.sh (it installs the deploy-check extra)")
    return str(path)


def hadolint(dockerfile: Path) -> subprocess.CompletedProcess:
    return subprocess.run([tool("hadolint"), "--no-color", str(dockerfile)], capture_output=True, text=True, timeout=120)


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined, comments dropped."""
    text = (REPO / "Dockerfile").read_text()
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = "\n".join(lines).replace("\\\n", " ")
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line.strip() else "")
            for line in joined.splitlines() if line.strip()]


def test_dockerfile_passes_hadolint():
    result = hadolint(REPO / "Dockerfile")
    assert result.returncode == 0 and result.stdout == "", result.stdout + result.stderr


def test_hadolint_flags_what_the_dockerfile_avoids(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install torch\nUSER root\n")
    result = hadolint(bad)
    assert result.returncode != 0
    for rule in ("DL3007", "DL3013", "DL3002"):  # the latest tag, an unpinned pip package, root
        assert rule in result.stdout


def test_dockerfile_pins_runs_non_root_and_enters_through_the_entrypoint():
    instructions = dockerfile_instructions()
    froms = [args for op, args in instructions if op == "FROM"]
    external = froms[0].split()[0]
    assert ":" in external and not external.endswith(":latest")
    assert {"torch-cpu", "torch-cuda"} <= {args.split()[-1] for args in froms if " AS " in args}
    assert froms[-1] == "torch-${VARIANT}"
    pyproject = (REPO / "pyproject.toml").read_text()
    for op, args in instructions:
        if op == "RUN" and "torch==" in args:
            pin = args.split('"torch==')[1].split('"')[0]
            assert f'"torch=={pin}"' in pyproject, "the image's torch differs from the project's pin"

    user = [args for op, args in instructions if op == "USER"][-1]
    assert user == "10001:10001"
    entrypoint = json.loads([args for op, args in instructions if op == "ENTRYPOINT"][-1])
    assert entrypoint[:2] == ["tini", "--"]
    script = REPO / Path(entrypoint[2]).relative_to("/opt/eden-serve")
    assert script == ENTRYPOINT and os.access(script, os.X_OK)
    command = json.loads([args for op, args in instructions if op == "CMD"][-1])
    properties = REPO / Path(command[command.index("--properties") + 1]).relative_to("/opt/eden-serve")
    assert properties.is_file()

    allowed = {line[1:].rstrip("/") for line in (REPO / ".dockerignore").read_text().splitlines() if line.startswith("!")}
    for op, args in instructions:
        if op == "COPY":
            for source in args.split()[:-1]:
                assert source in allowed, f"COPY {source} is not in the build context (.dockerignore)"


# --- Kubernetes ------------------------------------------------------------------------------------

OVERLAYS = {"cpu": "registry.example.com/eden-serve:0.1.0-cpu", "gpu": "registry.example.com/eden-serve:0.1.0-cuda"}
SIDES = {"cloud": "eden_encoder", "edge": "eden_ditdec"}
KUBERNETES_VERSIONS = ["1.29.0", "1.37.0"]  # the oldest and the newest this is checked against


def kustomize(directory: Path) -> list[dict]:
    result = subprocess.run([tool("kubectl"), "kustomize", str(directory)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@pytest.fixture(scope="module", params=sorted(OVERLAYS))
def overlay(request) -> tuple[str, list[dict]]:
    return request.param, kustomize(DEPLOY / "kubernetes" / "overlays" / request.param)


def find(docs: list[dict], kind: str, name: str | None = None) -> list[dict]:
    return [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]


def one(docs: list[dict], kind: str, name: str) -> dict:
    found = find(docs, kind, name)
    assert len(found) == 1, f"{len(found)} {kind} named {name}"
    return found[0]


def properties_of(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if line.strip() and not line.startswith("#"))


def test_overlays_render_the_expected_objects(overlay):
    _, docs = overlay
    names = sorted((d["kind"], d["metadata"]["name"]) for d in docs if d["kind"] != "ConfigMap")
    expected = [("Deployment", f"eden-{s}") for s in SIDES] + [("HorizontalPodAutoscaler", f"eden-{s}") for s in SIDES]
    expected += [("PodDisruptionBudget", f"eden-{s}") for s in SIDES] + [("Service", f"eden-{s}") for s in SIDES]
    expected += [("Ingress", "eden-serve"), ("NetworkPolicy", "eden-serve"), ("PersistentVolumeClaim", "eden-weights"),
                 ("PersistentVolumeClaim", "eden-media")]
    assert names == sorted(expected)
    assert [d["metadata"]["name"].startswith("eden-config-") for d in find(docs, "ConfigMap")] == [True]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_rendered_documents_validate_against_the_kubernetes_schemas(overlay, version):
    _, docs = overlay
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)


def test_schema_validation_refuses_a_misspelt_field(overlay):
    _, docs = overlay
    deployment = json.loads(json.dumps(one(docs, "Deployment", "eden-edge")))
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["livenesProbe"] = container.pop("livenessProbe")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[-1], strict=True)


def pod_of(deployment: dict) -> tuple[dict, dict]:
    pod = deployment["spec"]["template"]["spec"]
    assert len(pod["containers"]) == 1
    return pod, pod["containers"][0]


@pytest.mark.parametrize("side", sorted(SIDES))
def test_deployment_image_ports_probes_and_resources(overlay, side):
    name, docs = overlay
    deployment = one(docs, "Deployment", f"eden-{side}")
    pod, container = pod_of(deployment)
    assert container["image"] == OVERLAYS[name]
    assert container["args"][:2] == ["serve", side]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": 8080, "metrics": 8082}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/ping", "port": "http", "scheme": "HTTPS"}

    limits, requests_ = container["resources"]["limits"], container["resources"]["requests"]
    assert limits["cpu"] == requests_["cpu"]  # whole CPUs of its own: the worker threads follow the limit
    threads = {e["name"]: e for e in container["env"]}["EDEN_THREADS"]["valueFrom"]["resourceFieldRef"]
    assert threads == {"resource": "limits.cpu", "divisor": "1"}
    assert "--threads=$(EDEN_THREADS)" in container["args"]
    precision = [arg for arg in container["args"] if arg.startswith("--precision")]
    assert precision == (["--precision=auto"] if (name, side) == ("gpu", "edge") else [])  # a CPU's default stays fp32
    if name == "gpu":
        assert limits["nvidia.com/gpu"] == 1 and requests_["nvidia.com/gpu"] == 1
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    else:
        assert "nvidia.com/gpu" not in json.dumps(deployment)

    service = one(docs, "Service", f"eden-{side}")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert {(p["port"], p["targetPort"]) for p in service["spec"]["ports"]} == {(8080, "http"), (8082, "metrics")}


@pytest.mark.parametrize("side", sorted(SIDES))
def test_deployment_runs_non_root_unprivileged(overlay, side):
    _, docs = overlay
    pod, container = pod_of(one(docs, "Deployment", f"eden-{side}"))
    image_user = [args for op, args in dockerfile_instructions() if op == "USER"][-1]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert f"{pod['securityContext']['runAsUser']}:{pod['securityContext']['runAsGroup']}" == image_user
    assert pod["automountServiceAccountToken"] is False
    security = container["securityContext"]
    assert security["privileged"] is False and security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True and security["capabilities"]["drop"] == ["ALL"]
    writable = {m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")}
    assert writable == {"/models", "/tmp"}
    every = [c for d in find(docs, "Deployment") for key in ("containers", "initContainers") for c in d["spec"]["template"]["spec"].get(key, [])]
    assert not any(c.get("securityContext", {}).get("privileged") for c in every)


@pytest.mark.parametrize("side", sorted(SIDES))
def test_each_half_serves_tls_with_its_certificate_from_a_secret(overlay, side):
    """The certificate and the wire key come from Secrets the operator makes (none is committed),
    mounted read-only where the node's arguments look for them; the Ingress talks HTTPS to the pods."""
    _, docs = overlay
    pod, container = pod_of(one(docs, "Deployment", f"eden-{side}"))
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    expected = {"tls": (f"eden-{side}-tls", {"tls.crt", "tls.key"}), "wire-key": ("eden-wire-key", {"key"})}
    for name, (secret, keys) in expected.items():
        assert volumes[name]["secret"]["secretName"] == secret
        assert {item["key"] for item in volumes[name]["secret"]["items"]} == keys
        assert volumes[name]["secret"]["defaultMode"] == 0o440
        assert mounts[name]["readOnly"] is True
    tls_dir, key_dir = mounts["tls"]["mountPath"], mounts["wire-key"]["mountPath"]
    for argument in (f"--tls-cert={tls_dir}/tls.crt", f"--tls-key={tls_dir}/tls.key", f"--wire-key-file={key_dir}/key"):
        assert argument in container["args"]
    assert not find(docs, "Secret"), "no Secret is committed"
    service = one(docs, "Service", f"eden-{side}")
    assert {p["appProtocol"] for p in service["spec"]["ports"]} == {"https"}
    assert one(docs, "Ingress", "eden-serve")["metadata"]["annotations"]["nginx.ingress.kubernetes.io/backend-protocol"] == "HTTPS"


@pytest.mark.parametrize("side", sorted(SIDES))
def test_autoscaler_and_disruption_budget(overlay, side):
    _, docs = overlay
    deployment = one(docs, "Deployment", f"eden-{side}")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    hpa = one(docs, "HorizontalPodAutoscaler", f"eden-{side}")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": f"eden-{side}"}
    assert hpa["spec"]["metrics"] == [
        {"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 70}}}
    ]
    assert 1 < hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
    pdb = one(docs, "PodDisruptionBudget", f"eden-{side}")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    # A drain can always evict one pod: the budget stays below the autoscaler's floor.
    assert pdb["spec"]["minAvailable"] < hpa["spec"]["minReplicas"]


def test_config_map_turns_token_auth_off_and_feeds_the_pods(overlay):
    _, docs = overlay
    config_map = find(docs, "ConfigMap")[0]
    settings = properties_of(config_map["data"]["serve.properties"])
    assert settings["disable_token_authorization"] == "true"
    assert settings["inference_address"] == "http://0.0.0.0:8080"
    assert settings["metrics_address"] == "http://0.0.0.0:8082"
    assert settings["management_address"].startswith("http://127.0.0.1:")
    for side in SIDES:
        pod, container = pod_of(one(docs, "Deployment", f"eden-{side}"))
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["config"]["configMap"]["name"] == config_map["metadata"]["name"]
        assert {e["name"]: e for e in container["env"]}["EDEN_CHECKPOINT"]["valueFrom"]["configMapKeyRef"]["name"] == config_map["metadata"]["name"]
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        assert f"--properties={mounts['config']}/serve.properties" in container["args"]
        assert config_map["data"]["checkpoint"].startswith(mounts["weights"] + "/")
        assert volumes["weights"]["persistentVolumeClaim"]["claimName"] == "eden-weights"
    # Only the cloud opens server-side sources: its media root is the read-only media volume.
    pod, container = pod_of(one(docs, "Deployment", "eden-cloud"))
    media = {m["name"]: m for m in container["volumeMounts"]}["media"]
    assert media["readOnly"] and f"--media-root={media['mountPath']}" in container["args"]
    assert {v["name"]: v for v in pod["volumes"]}["media"]["persistentVolumeClaim"] == {"claimName": "eden-media", "readOnly": True}
    assert not any(a.startswith("--media-root") for a in pod_of(one(docs, "Deployment", "eden-edge"))[1]["args"])


def test_network_policy_admits_only_inference_and_metrics(overlay):
    _, docs = overlay
    policy = one(docs, "NetworkPolicy", "eden-serve")
    for side in SIDES:
        labels = one(docs, "Deployment", f"eden-{side}")["spec"]["template"]["metadata"]["labels"]
        assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    ports = sorted(p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"])
    assert ports == [8080, 8082]
    ingress = one(docs, "Ingress", "eden-serve")
    backends = {(p["path"], p["backend"]["service"]["name"]) for r in ingress["spec"]["rules"] for p in r["http"]["paths"]}
    assert backends == {(f"/predictions/{model}", f"eden-{side}") for side, model in SIDES.items()}


# --- KServe ----------------------------------------------------------------------------------------

# Fields of KServe's v1beta1 PredictorSpec that these manifests use (the KServe API reference).
PREDICTOR_FIELDS = {"minReplicas", "maxReplicas", "scaleMetric", "scaleTarget", "timeout", "securityContext", "containers", "volumes"}
SCALE_METRICS = {"cpu", "memory", "concurrency", "rps"}


@pytest.fixture(scope="module")
def kserve() -> list[dict]:
    return kustomize(DEPLOY / "kserve")


def validate_core(value: dict, definition: str) -> None:
    """``value`` against a core Kubernetes definition (e.g. io.k8s.api.core.v1.Container), strictly."""
    path = files("kubernetes_validate") / "kubernetes-json-schema" / f"v{KUBERNETES_VERSIONS[-1]}-local-strict" / "_definitions.json"
    definitions = Resource.from_contents(json.loads(path.read_text()))
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", "$ref": f"{definitions.id()}#/$defs/{definition}"}
    jsonschema.Draft202012Validator(schema, registry=definitions @ Registry()).validate(value)


@pytest.mark.parametrize("side", sorted(SIDES))
def test_inference_service_per_half(kserve, side):
    service = one(kserve, "InferenceService", f"eden-{side}")
    assert service["apiVersion"] == "serving.kserve.io/v1beta1"
    predictor = service["spec"]["predictor"]
    assert set(predictor) <= PREDICTOR_FIELDS
    assert predictor["scaleMetric"] in SCALE_METRICS
    assert isinstance(predictor["scaleTarget"], int) and predictor["scaleTarget"] > 0
    assert 0 <= predictor["minReplicas"] <= predictor["maxReplicas"]

    [container] = predictor["containers"]
    validate_core(container, "io.k8s.api.core.v1.Container")
    for volume in predictor["volumes"]:
        validate_core(volume, "io.k8s.api.core.v1.Volume")
    validate_core(predictor["securityContext"], "io.k8s.api.core.v1.PodSecurityContext")
    assert container["name"] == "kserve-container"
    assert container["image"] == OVERLAYS["cpu"]
    assert container["args"][:2] == ["serve", side]
    assert [p["containerPort"] for p in container["ports"]] == [8080]
    assert container["readinessProbe"]["httpGet"]["path"] == "/ping"
    assert f"--threads={container['resources']['limits']['cpu']}" in container["args"]
    assert predictor["securityContext"]["runAsNonRoot"] is True and predictor["securityContext"]["runAsUser"] != 0
    assert container["securityContext"]["privileged"] is False

    [config_map] = find(kserve, "ConfigMap")
    assert {v["name"]: v for v in predictor["volumes"]}["config"]["configMap"]["name"] == config_map["metadata"]["name"]
    assert properties_of(config_map["data"]["serve.properties"])["disable_token_authorization"] == "true"
    assert config_map["data"]["checkpoint"] == "hf://zhZ524/EDEN/eden.pt"


def test_core_validation_of_kserve_containers_refuses_a_misspelt_field(kserve):
    container = json.loads(json.dumps(one(kserve, "InferenceService", "eden-edge")["spec"]["predictor"]["containers"][0]))
    container["imagee"] = container.pop("image")
    with pytest.raises(jsonschema.ValidationError):
        validate_core(container, "io.k8s.api.core.v1.Container")


HOLDING = """
import sys, time
from harness.servers import torchserve
with torchserve(sys.argv[1], models=["eden_encoder.mar"]) as server:
    print(server.workdir, flush=True)
    time.sleep(600)
"""


def processes_naming(text: str) -> list[int]:
    """The processes whose command line names ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and text in (entry / "cmdline").read_bytes().decode(errors="replace"):
                found.append(int(entry.name))
        except OSError:
            pass  # gone meanwhile
    return found


@pytest.mark.serving
def test_a_script_holding_a_server_stops_it_when_sent_sigterm(store):
    """SIGTERM (a timeout's, a supervisor's) ends a script through its finally blocks, so the TorchServe
    it started, in a session of its own, does not outlive it (before: it ran on, orphaned)."""
    process = subprocess.Popen([sys.executable, "-c", HOLDING, str(store)], cwd=REPO, stdout=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONPATH": str(REPO)})
    workdir = ""
    try:
        workdir = process.stdout.readline().strip()
        assert workdir and processes_naming(workdir), "the server did not start"
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=150) != 0
        assert processes_naming(workdir) == []
    finally:
        process.kill()
        process.wait()
        for pid in processes_naming(workdir) if workdir else []:  # what a failure left, stopped all the same
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
