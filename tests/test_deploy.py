"""docker/: the images, the tracking stack (compose and Kubernetes), the Ray cluster launcher
config and the KubeRay job.

No Docker engine or Kubernetes cluster runs here, so the files are checked
statically against what they must agree with (the Makefile, pyproject.toml's
pins, the project's environment, Ray's own launcher schema, the field names of
KubeRay's v1 API and of the Kubernetes objects used), their sweep commands and
docs/cluster.md's are run as dry runs, and the compose file's MLflow server command
and health check are run for real on 127.0.0.1 (SQLite standing in for PostgreSQL).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.parse
import urllib.request
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
import yaml
from omegaconf import OmegaConf
from sqlalchemy.engine import make_url
from support.readme import blocks, commands
from support.repo import REPO
from support.servers import free_port, stop_group

from config.compose import compose_sweep
from sweeper import sweep as sweep_cli
from tracking import recorder

DOCKER = REPO / "docker"
CLUSTER_DOC = REPO / "docs" / "cluster.md"  # the cluster recipes (README links it)
IMAGE = "leaner-clustering"  # docker/Dockerfile's header builds leaner-clustering:gpu-COMMIT and :cpu-COMMIT
# The node image the cluster files name: tagged by commit (a reused tag leaves a node on the build it has),
# the placeholder replaced as docs/cluster.md shows.
NODE_IMAGE = f"{IMAGE}:gpu-GIT_COMMIT"
NAMESPACE = "leaner-clustering"  # where docker/kuberay/mlflow.yaml and docker/kuberay/rayjob.yaml are applied
# What docs/cluster.md promises and the cluster files' resources must give: ten trials (packs) share a GPU.
TRIALS_PER_GPU = 10


def dockerfile_lines(name: str = "Dockerfile") -> list[str]:
    """Instructions of a Dockerfile with continuation lines joined, comments dropped."""
    text = (DOCKER / name).read_text()
    text = re.sub(r"\\\n", " ", "\n".join(l for l in text.splitlines() if not l.lstrip().startswith("#")))
    return [" ".join(l.split()) for l in text.splitlines() if l.strip()]


def runs_of(lines: list[str]) -> list[str]:
    return [l for l in lines if l.startswith("RUN ")]


def makefile_recipe(target: str) -> list[str]:
    lines = (REPO / "Makefile").read_text().splitlines()
    start = next(i for i, l in enumerate(lines) if re.match(rf"^{re.escape(target)}\s*:", l))
    recipe = []
    for line in lines[start + 1 :]:
        if not line.startswith("\t"):
            break
        if not line.strip().startswith("#"):
            recipe.append(line.strip())
    return recipe


def env_example() -> dict[str, str]:
    pairs = [
        l.split("=", 1)
        for l in (DOCKER / "mlflow" / ".env.example").read_text().splitlines()
        if l.strip() and not l.startswith("#")
    ]
    return {k.strip(): v.strip() for k, v in pairs}


def interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's ${VAR}, ${VAR:-default} and ${VAR:?error} with `env` (unset or empty -> default)."""

    def one(match: re.Match) -> str:
        name, op, arg = match.group(1), match.group(2) or "", match.group(3) or ""
        value = env.get(name, "")
        if op == ":?" and not value:
            raise KeyError(f"{name} required: {arg}")
        return value if value or op != ":-" else arg

    return re.sub(r"\$\{(\w+)(:-|:\?)?([^}]*)\}", one, text)


def image_tag(image: str) -> str:
    return image.rsplit("/", 1)[-1]


def dry_run(args: list[str], capsys) -> str:
    """Run a sweep command's dry run in-process; returns its output, asserting success."""
    assert args[:3] == ["python", "-m", "sweeper.sweep"], args
    rc = sweep_cli.main(args[3:] + ["sweep.dry_run=true"])
    out, err = capsys.readouterr()
    assert rc == 0, f"{shlex.join(args)} rejected:\n{err}"
    return out


def composed(args: list[str], key: str) -> Any:
    """A key's value in the configuration a sweep command's words compose to, its cluster backend's file
    (conf/cluster/) included, as its trials run it."""
    assert args[:3] == ["python", "-m", "sweeper.sweep"], args
    return OmegaConf.select(compose_sweep(args[3:]), key)


def pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def ray_pin() -> str:
    """The Ray version pyproject.toml pins, in its dependencies and in its `cluster` extra alike."""
    project = pyproject()["project"]
    (tune,) = [d for d in project["dependencies"] if d.startswith("ray")]
    pin = tune.split("==")[-1]
    assert tune == f"ray[tune]=={pin}" and project["optional-dependencies"]["cluster"] == [
        f"ray[default]=={pin}"
    ]
    return pin


# --- images -----------------------------------------------------------------------------


def deps_install(lines: list[str]) -> str:
    (run,) = [r for r in runs_of(lines) if "pip install" in r and " torch " in r]
    return run


def test_dockerfile_installs_the_runtime_dependencies_in_a_layer_before_the_source():
    lines = dockerfile_lines()
    deps = deps_install(lines)
    # torch, then pyproject.toml's dependencies, `cluster` extra (Ray's dashboard and job API) and `gpu` extra
    # (NVML) as a requirements list; no dev extra (pytest...); each at the lock's versions, as the Makefile
    # installs them (not pyproject's ranges: the driver's MLflow would drift from the server's).
    assert "pip install -q -c requirements.lock torch " in deps, deps
    assert "$(PY) -m pip install -qq -c requirements.lock torch" in makefile_recipe("$(STAMP)")
    code = re.search(r'python -c "(.*?)" > /tmp/requirements\.txt', deps).group(1)
    listed = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    project = pyproject()
    assert listed.stdout.split("\n")[:-1] == (
        project["build-system"]["requires"]
        + project["project"]["dependencies"]
        + project["project"]["optional-dependencies"]["cluster"]
        + project["project"]["optional-dependencies"]["gpu"]
    )
    assert "pip install -q -c requirements.lock -r /tmp/requirements.txt" in deps
    text = "\n".join(lines)
    assert "[dev]" not in text and "'dev'" not in text, "the image holds the runtime only"
    # Layer order: pyproject.toml alone, the dependencies, then the source, installed without
    # dependencies and offline, so a code edit downloads nothing.
    copies = [i for i, l in enumerate(lines) if l.startswith("COPY ")]
    assert [lines[i].split()[2:] for i in copies] == [
        ["pyproject.toml", "requirements.lock", "/app/"],
        [".", "/app"],
    ], [lines[i] for i in copies]
    assert copies[0] < lines.index(deps) < copies[1]
    (project_install,) = [r for r in runs_of(lines[copies[1] :])]
    assert project_install.endswith("pip install -q --no-deps --no-build-isolation -e .")
    # The pip cache: a BuildKit cache mount in the user's home, owned by the user, out of the image.
    user = [l.split()[1] for l in lines if l.startswith("USER ")][-1]
    assert any(re.search(rf"useradd --create-home .* {user} ", r) for r in runs_of(lines))
    home = f"/home/{user}"
    assert deps.startswith(f"RUN --mount=type=cache,target={home}/.cache/pip,uid=${{UID}},gid=${{UID}} "), (
        deps
    )
    assert (DOCKER / "Dockerfile").read_text().startswith("# syntax=docker/dockerfile:1\n"), (
        "RUN --mount needs BuildKit's syntax"
    )
    # The host's .venv would overwrite the image's; .git stays out (the commit is a build argument).
    ignored = (DOCKER / "Dockerfile.dockerignore").read_text().split()
    assert {".venv", ".git", "docker/mlflow/.env"} <= set(ignored)


def test_the_image_has_a_compiler_for_torch_compile():
    """train.compile=inductor / cudagraphs generate C++ and Triton code: g++, and Python's headers."""
    (apt,) = [line for line in dockerfile_lines() if "apt-get install" in line]
    assert {"g++", "python3-dev"} <= set(apt.split()), apt


def test_dockerfile_labels_the_commit_which_the_runs_record():
    lines = dockerfile_lines()
    commit = [
        lines.index(l)
        for l in (
            "ARG GIT_COMMIT=unknown",
            "LABEL org.opencontainers.image.revision=$GIT_COMMIT",
            "ENV GIT_COMMIT=$GIT_COMMIT",
        )
    ]
    assert commit == sorted(commit) and commit[0] > lines.index(deps_install(lines)), (
        "a new commit keeps the dependencies"
    )
    header = re.sub(r"\\\n#\s+", " ", (DOCKER / "Dockerfile").read_text())  # its continued lines joined
    readme = [" ".join(c) for b in blocks() for c in commands(b.text)]
    builds = [l for l in header.splitlines() + readme if "docker build -f docker/Dockerfile " in l]
    assert len(builds) == 4 and all("--build-arg GIT_COMMIT=$GIT_COMMIT" in l for l in builds), builds
    assert (
        "GIT_COMMIT=$(git rev-parse HEAD)$(git diff --quiet HEAD || echo -dirty)" in CLUSTER_DOC.read_text()
    )


def test_git_commit_falls_back_to_the_images_build_argument(tmp_path, monkeypatch):
    """The image holds no .git: git_commit() then reports the GIT_COMMIT the image was built with."""
    monkeypatch.setattr(recorder, "REPO_DIR", tmp_path)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))  # no repository above tmp_path either
    monkeypatch.setenv("GIT_COMMIT", "0123abcd")
    assert recorder.git_commit() == "0123abcd"
    monkeypatch.delenv("GIT_COMMIT")
    assert recorder.git_commit() == "unknown"
    monkeypatch.setattr(recorder, "REPO_DIR", REPO)
    monkeypatch.setenv("GIT_COMMIT", "0123abcd")
    assert recorder.git_commit() != "0123abcd", "a checkout's own HEAD comes first"


def test_dockerfile_runs_as_non_root_with_cuda_and_cpu_variants():
    lines = dockerfile_lines()
    keywords = {"ARG", "FROM", "RUN", "USER", "WORKDIR", "COPY", "LABEL", "ENV", "ENTRYPOINT", "CMD"}
    assert {l.split()[0] for l in lines} <= keywords, "an instruction or a line continuation is broken"
    users = [l.split()[1] for l in lines if l.startswith("USER ")]
    assert users and users[-1] not in ("root", "0")
    first_copy = next(i for i, l in enumerate(lines) if l.startswith("COPY "))
    assert any(l.startswith("USER ") for l in lines[:first_copy]), "the project must be installed as the user"
    # Which base and torch build: tests/test_cluster_recipes.py.
    assert "FROM ${BASE_IMAGE}" in lines and any(l.startswith("ARG TORCH_INDEX=") for l in lines)
    assert 'PIP_EXTRA_INDEX_URL="${TORCH_INDEX}"' in deps_install(lines)
    header = (DOCKER / "Dockerfile").read_text()
    assert f"-t {IMAGE}:gpu-$GIT_COMMIT " in header and f"-t {IMAGE}:cpu-$GIT_COMMIT " in header
    assert "--build-arg TORCH_INDEX=https://download.pytorch.org/whl/cpu" in header
    # The venv comes first on PATH, also for login shells (KubeRay's `bash -lc`, `ray exec`).
    assert any(l.startswith("ENV PATH=/app/.venv/bin:") for l in lines)
    assert any("/etc/profile.d/" in l and "/app/.venv/bin" in l for l in runs_of(lines))


def test_ray_is_pinned_once_and_the_image_and_cluster_files_agree():
    pin = ray_pin()
    assert version("ray") == pin, "the project's environment installs pyproject.toml's Ray"
    # The image installs pyproject.toml's list (test above) and names no Ray version of its own.
    assert not re.search(r"ray\S*==", (DOCKER / "Dockerfile").read_text())
    assert kuberay_documents()["RayJob"]["spec"]["rayClusterSpec"]["rayVersion"] == pin
    # The laptop that runs `ray up` and `ray job submit` needs the cluster's Ray too.
    laptop = f'pip install "ray[default]=={pin}"'
    assert laptop in (DOCKER / "launcher" / "ray-cluster.yaml").read_text()
    assert laptop in CLUSTER_DOC.read_text()
    mentioned = set(
        re.findall(
            r"ray\[\w+\]==([\d.]+)|rayVersion: \"([\d.]+)\"",
            "\n".join(p.read_text() for p in [CLUSTER_DOC, *DOCKER.rglob("*.yaml")]),
        )
    )
    assert {v for pair in mentioned for v in pair if v} == {pin}


def test_mlflow_server_image_pins_the_clients_mlflow():
    """The server installs from requirements.lock (tests/test_cluster_recipes.py: every package of it), whose
    MLflow is the clients' and whose psycopg is the driver SQLAlchemy loads for the manifests' URIs."""
    lines = dockerfile_lines("mlflow/Dockerfile")
    lock = (REPO / "requirements.lock").read_text().splitlines()
    assert f"mlflow=={version('mlflow')}" in lock, "server and clients should run the same MLflow"
    assert any("-c /tmp/requirements.lock" in l and '"psycopg[binary]"' in l for l in lines)
    assert make_url("postgresql://user@host/db").get_dialect().driver == "psycopg"
    assert f"psycopg=={version('psycopg')}" in lock
    assert [l.split()[1] for l in lines if l.startswith("USER ")][-1] not in ("root", "0")
    compose = yaml.safe_load((DOCKER / "mlflow" / "compose.yaml").read_text())
    assert compose["services"]["mlflow"]["image"].endswith(f":{version('mlflow')}")
    # Its context is the whole checkout: everything but what it copies is ignored (docker/mlflow/.env too).
    ignore = (DOCKER / "mlflow" / "Dockerfile.dockerignore").read_text().splitlines()
    ignored = [l.strip() for l in ignore if l.strip() and not l.startswith("#")]
    copied = [l.split()[1] for l in lines if l.startswith("COPY ")]
    assert ignored == ["*", *(f"!{c}" for c in copied)] and all((REPO / c).is_file() for c in copied)


# --- tracking stack -------------------------------------------------------------------


def test_compose_binds_to_loopback_and_takes_credentials_from_the_env_file():
    text = (DOCKER / "mlflow" / "compose.yaml").read_text()
    compose = yaml.safe_load(text)
    services = compose["services"]
    assert set(services) == {"postgres", "mlflow"}
    assert "ports" not in services["postgres"], "PostgreSQL stays inside the compose network"
    build = services["mlflow"]["build"]
    context = (DOCKER / "mlflow" / build["context"].split()[0]).resolve()
    assert context == REPO and (context / build["dockerfile"]) == DOCKER / "mlflow" / "Dockerfile"
    example = env_example()
    used = set(re.findall(r"\$\{(\w+)", text))
    assert used == set(example), (
        f"documented in .env.example but unused, or used but undocumented: {used ^ set(example)}"
    )
    # With no MLFLOW_BIND set, every published port is on 127.0.0.1.
    unset_bind = {k: v for k, v in example.items() if k != "MLFLOW_BIND"}
    for name, service in services.items():
        for port in service.get("ports", []):
            host_ip = interpolate(str(port), unset_bind).split(":")[0]
            assert host_ip == "127.0.0.1", (name, port)
    # No secret has a default in the compose file: a missing one stops `docker compose up`.
    for secret in ("POSTGRES_PASSWORD", "MLFLOW_AUTH_ADMIN_PASSWORD", "MLFLOW_FLASK_SERVER_SECRET_KEY"):
        assert re.search(rf"\$\{{{secret}:\?", text), secret
        with pytest.raises(KeyError):
            interpolate(text, {k: v for k, v in example.items() if k != secret})
    ignored = subprocess.run(["git", "check-ignore", "-q", "docker/mlflow/.env"], cwd=REPO)
    assert ignored.returncode == 0, ".gitignore must list docker/mlflow/.env"


def test_compose_checks_the_mlflow_servers_health():
    service = yaml.safe_load((DOCKER / "mlflow" / "compose.yaml").read_text())["services"]["mlflow"]
    check = service["healthcheck"]
    # The image's own python (python:3.12-slim has no curl), on /health at the server's port in the container.
    assert next(l for l in dockerfile_lines("mlflow/Dockerfile") if l.startswith("FROM ")).startswith(
        "FROM python:"
    )
    assert check["test"][:3] == ["CMD", "python", "-c"]
    assert (
        f"'http://127.0.0.1:{service['command'][service['command'].index('--port') + 1]}/health'"
        in check["test"][3]
    )
    assert {"interval", "timeout", "retries", "start_period"} <= set(check)
    assert (
        "up -d --wait" in (DOCKER / "mlflow" / "compose.yaml").read_text()
        and "up -d --wait" in CLUSTER_DOC.read_text()
    )


def compose_health_check(port: int) -> int:
    """The compose file's health check of the MLflow server, pointed at 127.0.0.1:port; its exit status."""
    test = yaml.safe_load((DOCKER / "mlflow" / "compose.yaml").read_text())["services"]["mlflow"][
        "healthcheck"
    ]["test"]
    command = [sys.executable] + [a.replace("127.0.0.1:5000", f"127.0.0.1:{port}") for a in test[2:]]
    return subprocess.run(command, capture_output=True, timeout=30).returncode


def wait_http(url: str, seconds: float, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"server exited with {proc.returncode}"
        try:
            urllib.request.urlopen(url, timeout=2).close()
            return
        except (urllib.error.URLError, OSError):
            time.sleep(1)
    raise TimeoutError(f"{url} did not answer within {seconds}s")


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_compose_mlflow_server_serves_authenticated_runs_and_artifacts(tmp_path, _empty_store):
    """The compose file's MLflow command and environment, on SQLite: basic auth and proxied artifacts."""
    compose = yaml.safe_load((DOCKER / "mlflow" / "compose.yaml").read_text())
    service = compose["services"]["mlflow"]
    env_file = env_example()
    environment = {k: interpolate(str(v), env_file) for k, v in service["environment"].items()}
    assert environment["MLFLOW_BACKEND_STORE_URI"].startswith("postgresql://")
    assert environment["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] == "false"  # no job runner: nothing here uses it
    shutil.copyfile(_empty_store, tmp_path / "mlflow.db")  # migrated: the server skips MLflow's migrations
    environment["MLFLOW_BACKEND_STORE_URI"] = f"sqlite:///{tmp_path / 'mlflow.db'}"  # no PostgreSQL here
    environment["MLFLOW_ARTIFACTS_DESTINATION"] = str(tmp_path / "mlartifacts")
    command = [str(c) for c in service["command"]]
    port = free_port()
    command[command.index("--host") + 1] = "127.0.0.1"
    command[command.index("--port") + 1] = str(port)
    command[0] = str(Path(sys.executable).with_name("mlflow"))
    command += ["--workers", "1"]  # 2 cores here
    server_dir = tmp_path / "server"
    server_dir.mkdir()  # the container's working directory, where basic_auth.db goes
    server = subprocess.Popen(
        command,
        cwd=server_dir,
        env={**os.environ, **environment},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    uri = f"http://127.0.0.1:{port}"
    assert compose_health_check(free_port()) != 0, "the health check fails where no server answers"
    try:
        wait_http(f"{uri}/health", 300, server)
        assert compose_health_check(port) == 0
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{uri}/api/2.0/mlflow/experiments/search?max_results=1", timeout=10)
        assert refused.value.code == 401
        anonymous = subprocess.run(
            [sys.executable, "-m", "sweeper.train", f"tracking.uri={uri}"],
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert anonymous.returncode == 4, anonymous.stderr[-2000:]
        assert (
            "refused access (401)" in anonymous.stderr + anonymous.stdout
            and uri in anonymous.stderr + anonymous.stdout
        )
        user, password = environment["MLFLOW_AUTH_ADMIN_USERNAME"], environment["MLFLOW_AUTH_ADMIN_PASSWORD"]
        client_env = {
            **os.environ,
            "MLFLOW_TRACKING_USERNAME": user,
            "MLFLOW_TRACKING_PASSWORD": password,
            "PYTHONPATH": str(REPO),
        }
        train = subprocess.run(
            [
                sys.executable,
                "-m",
                "sweeper.train",
                f"tracking.uri={uri}",
                "tracking.experiment=compose",
                "train.steps=4",
                "train.eval_every=2",
                "task.n=16",
                "train.batch=4",
                "train.val_batches=1",
                f"train.workdir={tmp_path / 'runs'}",
            ],
            cwd=tmp_path,
            env=client_env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert train.returncode == 0, train.stderr[-2000:]
        run_id = re.search(r"run ([0-9a-f]{32})", train.stdout).group(1)
        os.environ.update({"MLFLOW_TRACKING_USERNAME": user, "MLFLOW_TRACKING_PASSWORD": password})
        from mlflow.tracking import MlflowClient

        from tracking.names import CHECKPOINT_DIR, CONFIG_ARTIFACT, CURVE_ARTIFACT, OUTCOME

        client = MlflowClient(tracking_uri=uri)
        run = client.get_run(run_id)
        assert run.data.tags[OUTCOME] == "finished" and run.data.params["train.steps"] == "4"
        top = {a.path for a in client.list_artifacts(run_id)}
        assert {CONFIG_ARTIFACT, CHECKPOINT_DIR, CURVE_ARTIFACT} <= top
        # Proxied artifacts: the files landed in the server's artifact destination, not with the client.
        stored = [p.name for p in (tmp_path / "mlartifacts").rglob("*") if p.is_file()]
        assert CONFIG_ARTIFACT in stored and CURVE_ARTIFACT in stored
    finally:
        for name in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
            os.environ.pop(name, None)
        stop_group(server, timeout=30)


# --- tracking stack on Kubernetes ------------------------------------------------------

# Field names of the Kubernetes objects the manifests use (core/v1, apps/v1, networking.k8s.io/v1):
# `kubectl apply` drops an unknown field silently (or warns), and the object runs without it.
POD_SPEC = {
    "activeDeadlineSeconds",
    "affinity",
    "automountServiceAccountToken",
    "containers",
    "dnsConfig",
    "dnsPolicy",
    "enableServiceLinks",
    "ephemeralContainers",
    "hostAliases",
    "hostIPC",
    "hostNetwork",
    "hostPID",
    "hostUsers",
    "hostname",
    "imagePullSecrets",
    "initContainers",
    "nodeName",
    "nodeSelector",
    "os",
    "overhead",
    "preemptionPolicy",
    "priority",
    "priorityClassName",
    "readinessGates",
    "resourceClaims",
    "resources",
    "restartPolicy",
    "runtimeClassName",
    "schedulerName",
    "schedulingGates",
    "securityContext",
    "serviceAccount",
    "serviceAccountName",
    "setHostnameAsFQDN",
    "shareProcessNamespace",
    "subdomain",
    "terminationGracePeriodSeconds",
    "tolerations",
    "topologySpreadConstraints",
    "volumes",
}
POD_SECURITY = {
    "appArmorProfile",
    "fsGroup",
    "fsGroupChangePolicy",
    "runAsGroup",
    "runAsNonRoot",
    "runAsUser",
    "seLinuxChangePolicy",
    "seLinuxOptions",
    "seccompProfile",
    "supplementalGroups",
    "supplementalGroupsPolicy",
    "sysctls",
    "windowsOptions",
}
CONTAINER = {
    "args",
    "command",
    "env",
    "envFrom",
    "image",
    "imagePullPolicy",
    "lifecycle",
    "livenessProbe",
    "name",
    "ports",
    "readinessProbe",
    "resizePolicy",
    "resources",
    "restartPolicy",
    "securityContext",
    "startupProbe",
    "stdin",
    "stdinOnce",
    "terminationMessagePath",
    "terminationMessagePolicy",
    "tty",
    "volumeDevices",
    "volumeMounts",
    "workingDir",
}
PROBE = {
    "exec",
    "failureThreshold",
    "grpc",
    "httpGet",
    "initialDelaySeconds",
    "periodSeconds",
    "successThreshold",
    "tcpSocket",
    "terminationGracePeriodSeconds",
    "timeoutSeconds",
}
CONTAINER_PORT = {"containerPort", "hostIP", "hostPort", "name", "protocol"}
ENV_VAR = {"name", "value", "valueFrom"}
VOLUME_MOUNT = {
    "mountPath",
    "mountPropagation",
    "name",
    "readOnly",
    "recursiveReadOnly",
    "subPath",
    "subPathExpr",
}
SPECS = {
    ("v1", "Service"): {
        "allocateLoadBalancerNodePorts",
        "clusterIP",
        "clusterIPs",
        "externalIPs",
        "externalName",
        "externalTrafficPolicy",
        "healthCheckNodePort",
        "internalTrafficPolicy",
        "ipFamilies",
        "ipFamilyPolicy",
        "loadBalancerClass",
        "loadBalancerIP",
        "loadBalancerSourceRanges",
        "ports",
        "publishNotReadyAddresses",
        "selector",
        "sessionAffinity",
        "sessionAffinityConfig",
        "trafficDistribution",
        "type",
    },
    ("v1", "PersistentVolumeClaim"): {
        "accessModes",
        "dataSource",
        "dataSourceRef",
        "resources",
        "selector",
        "storageClassName",
        "volumeAttributesClassName",
        "volumeMode",
        "volumeName",
    },
    ("apps/v1", "Deployment"): {
        "minReadySeconds",
        "paused",
        "progressDeadlineSeconds",
        "replicas",
        "revisionHistoryLimit",
        "selector",
        "strategy",
        "template",
    },
    ("apps/v1", "StatefulSet"): {
        "minReadySeconds",
        "ordinals",
        "persistentVolumeClaimRetentionPolicy",
        "podManagementPolicy",
        "replicas",
        "revisionHistoryLimit",
        "selector",
        "serviceName",
        "template",
        "updateStrategy",
        "volumeClaimTemplates",
    },
    ("networking.k8s.io/v1", "NetworkPolicy"): {"egress", "ingress", "podSelector", "policyTypes"},
}


def check_pod_spec(pod: dict, where: str, claim_templates: tuple[str, ...] = ()) -> None:
    """Field names of a pod template's spec, its containers, probes, ports, env and mounts; non-root.

    claim_templates: the volumes a StatefulSet adds from its volumeClaimTemplates.
    """
    assert set(pod) <= POD_SPEC, (where, set(pod) - POD_SPEC)
    assert set(pod["securityContext"]) <= POD_SECURITY and pod["securityContext"]["runAsNonRoot"], where
    volumes = {v["name"] for v in pod.get("volumes", [])} | set(claim_templates)
    for container in pod["containers"]:
        assert set(container) <= CONTAINER, (where, set(container) - CONTAINER)
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert set(container.get(probe, {})) <= PROBE, (where, probe)
        assert all(set(p) <= CONTAINER_PORT for p in container.get("ports", [])), where
        assert all(set(e) <= ENV_VAR for e in container.get("env", [])), where
        for mount in container.get("volumeMounts", []):
            assert set(mount) <= VOLUME_MOUNT and mount["name"] in volumes, (where, mount)


def k8s_mlflow_documents() -> dict[tuple[str, str], dict]:
    docs = list(yaml.safe_load_all((DOCKER / "kuberay" / "mlflow.yaml").read_text()))
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def container_env(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container["env"]}


def test_k8s_mlflow_manifests_use_kubernetes_fields_and_select_their_pods():
    docs = k8s_mlflow_documents()
    assert set(docs) == {
        ("Service", "mlflow-postgres"),
        ("StatefulSet", "mlflow-postgres"),
        ("NetworkPolicy", "mlflow-postgres"),
        ("PersistentVolumeClaim", "mlflow-data"),
        ("Deployment", "mlflow"),
        ("Service", "mlflow"),
    }
    for (kind, name), doc in docs.items():
        assert (
            set(doc) == {"apiVersion", "kind", "metadata", "spec"} and "namespace" not in doc["metadata"]
        ), name
        allowed = SPECS[doc["apiVersion"], kind]
        assert set(doc["spec"]) <= allowed, (kind, name, set(doc["spec"]) - allowed)
    workloads = {name: doc for (kind, name), doc in docs.items() if kind in ("Deployment", "StatefulSet")}
    for name, doc in workloads.items():
        labels = doc["spec"]["template"]["metadata"]["labels"]
        assert doc["spec"]["selector"]["matchLabels"].items() <= labels.items(), name
        templates = tuple(t["metadata"]["name"] for t in doc["spec"].get("volumeClaimTemplates", []))
        check_pod_spec(doc["spec"]["template"]["spec"], name, templates)
        # Each Service selects its workload's pods, on a port the container declares.
        service = docs["Service", name]["spec"]
        assert service["selector"].items() <= labels.items(), name
        (container,) = doc["spec"]["template"]["spec"]["containers"]
        declared = {p["name"] for p in container["ports"]} | {p["containerPort"] for p in container["ports"]}
        assert all(p["targetPort"] in declared for p in service["ports"]), name
    assert workloads["mlflow-postgres"]["spec"]["serviceName"] == "mlflow-postgres"
    # PostgreSQL admits the MLflow pods only.
    policy = docs["NetworkPolicy", "mlflow-postgres"]["spec"]
    assert (
        policy["podSelector"]["matchLabels"]
        == workloads["mlflow-postgres"]["spec"]["selector"]["matchLabels"]
    )
    assert policy["policyTypes"] == ["Ingress"]
    (rule,) = policy["ingress"]
    assert [f["podSelector"]["matchLabels"] for f in rule["from"]] == [
        workloads["mlflow"]["spec"]["selector"]["matchLabels"]
    ]
    mlflow_pod = workloads["mlflow"]["spec"]["template"]["spec"]
    claims = [v["persistentVolumeClaim"]["claimName"] for v in mlflow_pod["volumes"]]
    assert claims == ["mlflow-data"]


def test_k8s_mlflow_runs_the_compose_server_on_postgresql_with_health_probes():
    docs = k8s_mlflow_documents()
    (mlflow,) = docs["Deployment", "mlflow"]["spec"]["template"]["spec"]["containers"]
    (postgres,) = docs["StatefulSet", "mlflow-postgres"]["spec"]["template"]["spec"]["containers"]
    compose = yaml.safe_load((DOCKER / "mlflow" / "compose.yaml").read_text())["services"]
    # The same images, command and settings as the compose stack (whose command the slow test above runs).
    assert image_tag(mlflow["image"]) == compose["mlflow"]["image"]
    assert postgres["image"] == compose["postgres"]["image"]
    assert mlflow["command"] == compose["mlflow"]["command"]
    env = container_env(mlflow)
    assert set(compose["mlflow"]["environment"]) <= set(env)
    # Secrets come from the Secret; a $(VAR) reference needs VAR earlier in the list (Kubernetes' rule).
    names = [e["name"] for e in mlflow["env"]]
    for i, entry in enumerate(mlflow["env"]):
        assert all(ref in names[:i] for ref in re.findall(r"\$\((\w+)\)", entry.get("value", ""))), entry
        if re.search("PASSWORD|SECRET", entry["name"]):
            assert entry["valueFrom"]["secretKeyRef"]["name"] == "mlflow-server", entry
    # The backend store is the PostgreSQL Service, database and user.
    store = urllib.parse.urlsplit(env["MLFLOW_BACKEND_STORE_URI"]["value"])
    pg = {e["name"]: e.get("value") for e in postgres["env"]}
    port = docs["Service", "mlflow-postgres"]["spec"]["ports"][0]["port"]
    assert (store.scheme, store.hostname, store.port) == ("postgresql", "mlflow-postgres", port)
    assert (store.username, store.path) == (pg["POSTGRES_USER"], "/" + pg["POSTGRES_DB"])
    assert store.password == "$(POSTGRES_PASSWORD)"
    assert container_env(postgres)["POSTGRES_PASSWORD"]["valueFrom"] == env["POSTGRES_PASSWORD"]["valueFrom"]
    # Artifacts and basic_auth.db (written to the working directory) on the volume.
    (mount,) = mlflow["volumeMounts"]
    assert env["MLFLOW_ARTIFACTS_DESTINATION"]["value"].startswith(mount["mountPath"] + "/")
    assert mlflow["workingDir"] == mount["mountPath"]
    # Probes: MLflow's /health (no login needed) on its port; pg_isready for PostgreSQL.
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert mlflow[probe]["httpGet"] == {"path": "/health", "port": mlflow["ports"][0]["name"]}, probe
    assert mlflow["command"][mlflow["command"].index("--port") + 1] == str(
        mlflow["ports"][0]["containerPort"]
    )
    for probe in ("readinessProbe", "livenessProbe"):
        assert postgres[probe]["exec"]["command"][0] == "pg_isready", probe


def test_rayjob_tracking_uri_is_the_k8s_mlflow_service_which_accepts_it():
    from mlflow.server.security_utils import is_allowed_host_header

    uri = urllib.parse.urlsplit(
        composed(shlex.split(kuberay_documents()["RayJob"]["spec"]["entrypoint"]), "tracking.uri")
    )
    docs = k8s_mlflow_documents()
    service = docs["Service", "mlflow"]
    assert (
        uri.scheme == "http"
        and uri.hostname == f"{service['metadata']['name']}.{NAMESPACE}.svc.cluster.local"
    )
    assert uri.port == service["spec"]["ports"][0]["port"]
    # Both files go to that namespace, in that order (the RayJob's header refers to the MLflow one).
    readme = CLUSTER_DOC.read_text()
    applies = [
        readme.index(f"kubectl -n {NAMESPACE} apply -f docker/kuberay/mlflow.yaml"),
        readme.index(f"docker/kuberay/rayjob.yaml | kubectl -n {NAMESPACE} apply -f -"),
    ]
    assert applies == sorted(applies)
    assert (
        f"kubectl -n {NAMESPACE} apply -f docker/kuberay/mlflow.yaml"
        in (DOCKER / "kuberay" / "mlflow.yaml").read_text()
    )
    # MLflow's DNS-rebinding guard answers the driver (Host: the Service's name) and port-forwards only.
    (mlflow,) = docs["Deployment", "mlflow"]["spec"]["template"]["spec"]["containers"]
    allowed = [h.strip() for h in container_env(mlflow)["MLFLOW_SERVER_ALLOWED_HOSTS"]["value"].split(",")]
    assert is_allowed_host_header(allowed, uri.netloc)
    assert is_allowed_host_header(allowed, "127.0.0.1:5000") and is_allowed_host_header(
        allowed, "localhost:5000"
    )
    assert not is_allowed_host_header(allowed, "attacker.example:5000")


# --- Ray cluster launcher ---------------------------------------------------------------


def launcher_config() -> dict:
    return yaml.safe_load((DOCKER / "launcher" / "ray-cluster.yaml").read_text())


def test_ray_cluster_yaml_passes_rays_own_validation():
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = launcher_config()
    validate_config(prepare_config(config))  # what `ray up` runs first; raises on any unknown key
    assert image_tag(config["docker"]["image"]) == NODE_IMAGE
    head = " ".join(config["head_start_ray_commands"])
    assert "--dashboard-host=127.0.0.1" in head, "the dashboard and its job API stay on the head's loopback"
    options = config["docker"]["run_options"]
    assert "--env RAY_AUTH_MODE=token" in options, "Ray's token authentication on every node"
    token = next(o.split("=", 1)[1] for o in options if o.startswith("--env RAY_AUTH_TOKEN_PATH="))
    assert token.startswith("/shared/secrets/")
    mounts = [o for o in config["docker"]["run_options"] if o.startswith("--volume ")]
    assert "--volume /shared:/shared" in mounts
    assert all("mlflow.env" not in o for o in config["docker"]["run_options"]), (
        "only the driver needs MLflow secrets"
    )
    # docs/cluster.md allows a head without a GPU: Docker refuses `--gpus all` there.
    assert "--gpus all" not in options + config["docker"].get("head_run_options", [])
    assert "--gpus all" in config["docker"]["worker_run_options"]


def launcher_submit() -> list[str]:
    """The `ray job submit` command of the file's header."""
    (line,) = [
        l
        for l in (DOCKER / "launcher" / "ray-cluster.yaml").read_text().splitlines()
        if l.startswith("#   ray job submit ")
    ]
    return shlex.split(line.removeprefix("#"))


def entrypoint(submit: list[str]) -> list[str]:
    return submit[submit.index("--") + 1 :]


def test_ray_cluster_sweep_is_submitted_as_a_ray_job(capsys):
    submit = launcher_submit()
    readme = [c for b in blocks() for c in commands(b.text) if c[:3] == ["ray", "job", "submit"]]
    assert readme == [submit], "docs/cluster.md shows the launcher's command, word for word"
    # To the job API that `ray dashboard` forwards from the head's loopback, with Ray's token. No
    # --working-dir: the driver and the trials run the image's code, which its GIT_COMMIT names.
    assert submit[: submit.index("--")] == ["ray", "job", "submit", "--address", "http://127.0.0.1:8265"]
    header = (DOCKER / "launcher" / "ray-cluster.yaml").read_text()
    assert (
        "#   ray up docker/launcher/ray-cluster.yaml\n" in header
        and "#   ray dashboard docker/launcher/ray-cluster.yaml " in header
    )
    assert "export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=" in header
    args = entrypoint(submit)
    out = dry_run(args, capsys)
    assert out.strip().splitlines()[-1] == "300 configurations x 10 seeds = 3000 trials"
    assert composed(args, "cluster.address") == "auto"
    assert composed(args, "cluster.storage").startswith("/shared/"), "checkpoints must be on the shared mount"
    # The driver runs on the head, in the container that shares the host's network: the tracking
    # stack of docker/mlflow/compose.yaml publishes its port on the head's loopback.
    assert composed(args, "tracking.uri") == "http://127.0.0.1:5000"


# --- KubeRay ----------------------------------------------------------------------------

# Field names of KubeRay's ray.io/v1 API (rayjob_types.go, raycluster_types.go): a typo here
# would be dropped silently by `kubectl apply` and the cluster would run without it.
RAYJOB_SPEC = {
    "activeDeadlineSeconds",
    "backoffLimit",
    "rayClusterSpec",
    "submitterPodTemplate",
    "metadata",
    "clusterSelector",
    "submitterConfig",
    "managedBy",
    "deletionStrategy",
    "entrypoint",
    "runtimeEnvYAML",
    "jobId",
    "submissionMode",
    "entrypointResources",
    "entrypointNumCpus",
    "entrypointNumGpus",
    "ttlSecondsAfterFinished",
    "shutdownAfterJobFinishes",
    "suspend",
    "schedule",
}
RAYCLUSTER_SPEC = {
    "suspend",
    "managedBy",
    "autoscalerOptions",
    "headServiceAnnotations",
    "enableInTreeAutoscaling",
    "gcsFaultToleranceOptions",
    "headGroupSpec",
    "rayVersion",
    "workerGroupSpecs",
    "upgradeStrategy",
    "historyServerOptions",
    "networkPolicy",
    "tlsOptions",
}
HEAD_GROUP = {"template", "headService", "enableIngress", "rayStartParams", "serviceType"}
WORKER_GROUP = {
    "suspend",
    "groupName",
    "replicas",
    "minReplicas",
    "maxReplicas",
    "idleTimeoutSeconds",
    "rayStartParams",
    "template",
    "scaleStrategy",
    "numOfHosts",
}


def kuberay_documents() -> dict[str, dict]:
    """The RayJob and its volume claim (docker/kuberay/storage.yaml, a file of its own: it outlives the
    job)."""
    docs = [
        yaml.safe_load((DOCKER / "kuberay" / name).read_text()) for name in ("rayjob.yaml", "storage.yaml")
    ]
    return {d["kind"]: d for d in docs}


def test_rayjob_manifest_uses_kuberay_fields_images_and_shared_storage():
    docs = kuberay_documents()
    assert set(docs) == {"PersistentVolumeClaim", "RayJob"}
    job, claim = docs["RayJob"], docs["PersistentVolumeClaim"]
    assert job["apiVersion"] == "ray.io/v1"
    spec = job["spec"]
    assert set(spec) <= RAYJOB_SPEC, set(spec) - RAYJOB_SPEC
    cluster = spec["rayClusterSpec"]
    assert set(cluster) <= RAYCLUSTER_SPEC, set(cluster) - RAYCLUSTER_SPEC
    assert set(cluster["headGroupSpec"]) <= HEAD_GROUP
    assert all(set(g) <= WORKER_GROUP for g in cluster["workerGroupSpecs"])
    assert cluster["rayVersion"] == ray_pin(), "rayVersion should be the Ray the image installs"
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert set(claim["spec"]) <= SPECS["v1", "PersistentVolumeClaim"], set(claim["spec"])

    storage = composed(shlex.split(spec["entrypoint"]), "cluster.storage")
    uid = next(l for l in dockerfile_lines() if l.startswith("ARG UID=")).split("=", 1)[1]
    pods = [("head", cluster["headGroupSpec"]["template"]["spec"])]
    pods += [(g["groupName"], g["template"]["spec"]) for g in cluster["workerGroupSpecs"]]
    for name, pod in pods:
        check_pod_spec(pod, name)
        assert pod["securityContext"]["runAsNonRoot"] and str(pod["securityContext"]["runAsUser"]) == uid, (
            name
        )
        volumes = {v["name"]: v for v in pod["volumes"]}
        (container,) = pod["containers"]
        assert image_tag(container["image"]) == NODE_IMAGE, name
        mounted = [
            m for m in container["volumeMounts"] if storage.startswith(m["mountPath"].rstrip("/") + "/")
        ]
        assert mounted, f"{name}: cluster.storage={storage} is not on a mounted volume"
        claim_name = volumes[mounted[0]["name"]]["persistentVolumeClaim"]["claimName"]
        assert claim_name == claim["metadata"]["name"], name
        secrets = {e["secretRef"]["name"]: e["secretRef"] for e in container.get("envFrom", [])}
        assert list(secrets) == (["mlflow-credentials"] if name == "head" else []) + ["storage-credentials"]
        assert secrets["storage-credentials"]["optional"], "an object store's credentials, when it has one"


def test_rayjob_gives_the_shared_folders_to_the_images_user_and_keeps_every_nodes_logs_there():
    """The image's user writes cluster.storage on a volume whose ownership fsGroup may not set (NFS), and
    each Ray node's logs (the driver's, its trials' output) outlive the cluster KubeRay deletes."""
    spec = kuberay_documents()["RayJob"]["spec"]
    storage = composed(shlex.split(spec["entrypoint"]), "cluster.storage")
    uid = next(l for l in dockerfile_lines() if l.startswith("ARG UID=")).split("=", 1)[1]
    head = spec["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    (init,) = head["initContainers"]
    assert set(init) <= CONTAINER and init["image"] == NODE_IMAGE
    assert init["command"][:6] == ["install", "-d", "-o", uid, "-g", uid] and storage in init["command"]
    assert init["securityContext"]["runAsUser"] == 0, "root, to give the folders away"
    assert [m["mountPath"] for m in init["volumeMounts"]] == ["/shared"] and storage.startswith("/shared/")
    pods = [head] + [g["template"]["spec"] for g in spec["rayClusterSpec"]["workerGroupSpecs"]]
    for pod in pods:
        (container,) = pod["containers"]
        (shell, flag, script) = container["lifecycle"]["preStop"]["exec"]["command"]
        logs = re.fullmatch(r"mkdir -p (\S+) && cp -r /tmp/ray/session_latest/logs/\. \1/", script).group(1)
        assert (shell, flag) == ("sh", "-c") and logs == "/shared/ray-logs/$(hostname)", container["name"]
        assert os.path.dirname(logs) in init["command"], "the logs' folder belongs to the user too"
        assert pod["terminationGracePeriodSeconds"] >= 60, "time for the copy before the pod is killed"
    assert spec["shutdownAfterJobFinishes"]


def test_an_object_stores_credentials_reach_every_node_of_the_launcher():
    """cluster.storage=s3://...: the trials on every node write checkpoints there, with the credentials of
    /shared/secrets/storage.env, which docs/cluster.md's steps make (empty where none are needed, as Docker
    refuses a missing --env-file). (The RayJob's:
    test_rayjob_manifest_uses_kuberay_fields_images_and_shared_storage.)"""
    config = launcher_config()
    env_file = "/shared/secrets/storage.env"
    assert f"--env-file {env_file}" in config["docker"]["run_options"], "every node's, not the head's alone"
    made = [c for b in blocks() for c in commands(b.text) if c[:1] == ["touch"]]
    assert ["touch", env_file] in made
    assert "storage-credentials" in CLUSTER_DOC.read_text()


def test_rayjob_ray_pods_and_its_submitter_use_rays_token_from_a_secret():
    """As the launcher config: every Ray process and the `ray job submit` client present the token."""
    job = kuberay_documents()["RayJob"]["spec"]
    submitter = job["submitterPodTemplate"]["spec"]
    check_pod_spec(submitter, "submitter")
    (container,) = submitter["containers"]
    assert image_tag(container["image"]) == NODE_IMAGE, "the submitter runs `ray job submit`: it needs Ray"
    assert "command" not in container, "KubeRay supplies the submit command from the entrypoint"
    cluster = job["rayClusterSpec"]
    pods = [("head", cluster["headGroupSpec"]["template"]["spec"]), ("submitter", submitter)]
    pods += [(g["groupName"], g["template"]["spec"]) for g in cluster["workerGroupSpecs"]]
    secret_refs = set()
    for name, pod in pods:
        for container in pod["containers"]:
            env = container_env(container)
            assert env["RAY_AUTH_MODE"] == {"name": "RAY_AUTH_MODE", "value": "token"}, name
            assert set(env["RAY_AUTH_TOKEN"]) == {"name", "valueFrom"}, (
                f"{name}: the token only from a Secret"
            )
            ref = env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]
            secret_refs.add((ref["name"], ref["key"]))
    assert len(secret_refs) == 1, f"one token for the whole cluster: {secret_refs}"
    ((secret, key),) = secret_refs
    header = (DOCKER / "kuberay" / "rayjob.yaml").read_text()
    assert f"create secret generic {secret} \\\n#     --from-literal={key}=" in header, "the header makes it"
    readme = [" ".join(c) for b in blocks() for c in commands(b.text) if c[:2] == ["kubectl", "-n"]]
    assert any(f"create secret generic {secret} --from-literal={key}=" in c for c in readme), readme


# --- resources: the same in docs/cluster.md and both cluster files ---------------------------------

RESOURCES = ("cluster.pack", "cluster.cpus_per_trial", "cluster.gpus_per_trial", "train.device")
# A report in ten evaluation rounds: the rate the driver's one writing thread keeps up with against a tracking
# server with basic auth (docs/cluster.md, "The tracking server at volume"; python -m sweeper.scale_probe).
RECIPE = (*RESOURCES, "cluster.report_every")


JOINS = ("cluster=", "cluster.address=")  # the words by which a sweep command joins a cluster


def cluster_sweeps() -> dict[str, list[str]]:
    """Every sweep command that joins a cluster: the docs', the launcher's and the RayJob's."""
    readme = [
        c
        for b in blocks()
        for c in commands(b.text)
        if c[:3] == ["python", "-m", "sweeper.sweep"] and any(w.startswith(JOINS) for w in c)
    ]
    sweeps = {f"docs command {i + 1}": c for i, c in enumerate(readme)}
    sweeps["docker/launcher/ray-cluster.yaml"] = entrypoint(launcher_submit())
    sweeps["docker/kuberay/rayjob.yaml"] = shlex.split(kuberay_documents()["RayJob"]["spec"]["entrypoint"])
    return sweeps


def test_node_images_are_tagged_by_the_commit_they_were_built_from():
    """Every build command tags the image with its commit and the docs apply the cluster files with the
    placeholder replaced by it: a new build is a new tag, which every node pulls."""
    doc = CLUSTER_DOC.read_text()
    builds = [
        l for b in blocks() for l in b.text.splitlines() if l.startswith("docker build -f docker/Dockerfile")
    ]
    assert len(builds) == 2 and all(re.search(rf"-t {IMAGE}:(gpu|cpu)-\$GIT_COMMIT ", b) for b in builds)
    assert "GIT_COMMIT=$(git rev-parse HEAD)" in doc
    assert f'sed "s|{NODE_IMAGE}|$REGISTRY/{IMAGE}:gpu-$GIT_COMMIT|"' in doc
    images = [c["image"] for c in kuberay_containers()] + [launcher_config()["docker"]["image"]]
    assert images and set(images) == {NODE_IMAGE}


def kuberay_containers() -> list[dict]:
    spec = kuberay_documents()["RayJob"]["spec"]
    pods = [spec["submitterPodTemplate"], spec["rayClusterSpec"]["headGroupSpec"]["template"]]
    pods += [g["template"] for g in spec["rayClusterSpec"]["workerGroupSpecs"]]
    return [c for pod in pods for c in pod["spec"]["containers"]]


@pytest.mark.slow  # the cluster sweeps composed: 7 s
def test_cluster_sweeps_train_packs_ten_to_a_gpu(capsys):
    sweeps = cluster_sweeps()
    assert len(sweeps) == 4, list(sweeps)  # docs/cluster.md: `ray job submit` and Ray started by hand
    stated = {name: tuple(composed(args, key) for key in RECIPE) for name, args in sweeps.items()}
    assert len(set(stated.values())) == 1, f"stated differently: {stated}"
    pack, cpus_per_trial, gpus_per_trial, device, report_every = stated.popitem()[1]
    assert report_every == 10, "one report in ten evaluations: the writer keeps up"
    assert pack == "seeds", "a trial trains the ten seeds of a configuration together"
    assert device == "cuda", "a trial whose CUDA does not start fails, rather than training on the CPU"
    assert TRIALS_PER_GPU * gpus_per_trial == pytest.approx(1)
    for name, args in sweeps.items():
        assert composed(args, "sweep.name") == "paper" and composed(args, "cluster.address") == "auto", name
        out = dry_run(args, capsys).strip().splitlines()
        assert out[-2:] == [
            "cluster.pack=seeds: 300 Ray Tune trials, each training the 10 seeds of one "
            "configuration together",
            "300 configurations x 10 seeds = 3000 trials",
        ], name
    # KubeRay's workers: Ray counts their CPUs and GPUs from the limits (unless rayStartParams says
    # otherwise), and the CPUs must not run out before ten trials per GPU.
    cluster = kuberay_documents()["RayJob"]["spec"]["rayClusterSpec"]
    assert cluster["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0", (
        "the head runs the driver, no trials"
    )
    for group in cluster["workerGroupSpecs"]:
        pod = group["template"]["spec"]["containers"][0]["resources"]
        assert pod["requests"] == pod["limits"], "the scheduler reserves what Ray counts"
        node_gpus = int(group["rayStartParams"].get("num-gpus", pod["limits"]["nvidia.com/gpu"]))
        node_cpus = int(group["rayStartParams"].get("num-cpus", pod["limits"]["cpu"]))
        assert node_gpus >= 1
        by_gpu, by_cpu = round(node_gpus / gpus_per_trial), int(node_cpus // cpus_per_trial)
        assert by_gpu == TRIALS_PER_GPU * node_gpus and by_cpu >= by_gpu, (group["groupName"], by_gpu, by_cpu)


# --- SLURM ------------------------------------------------------------------------------

SBATCH = DOCKER / "slurm" / "sweep.sbatch"


def test_slurm_script_trains_the_recipes_sweep_and_stops_before_slurms_warning(capsys):
    """Its run is tests/test_slurm.py; here what only a real allocation would show: its default sweep is the
    other recipes' (dry run), its nodes have the CPUs for ten trials per GPU and the driver, its budget's
    margin ends the sweep before SLURM's warning signal, it may be requeued, and bash parses it."""
    text = SBATCH.read_text()
    assert subprocess.run(["bash", "-n", str(SBATCH)]).returncode == 0
    options = dict(re.findall(r"^#SBATCH --([\w-]+)(?:=(\S+))?$", text, flags=re.M))
    (default,) = re.findall(r"^    set -- (sweep=.*)$", text, flags=re.M)
    args = ["python", "-m", "sweeper.sweep", *default.split()]
    assert [composed(args, key) for key in RECIPE] == ["seeds", 1, 0.1, "cuda", 10]
    assert dry_run(args, capsys).strip().splitlines()[-1] == "300 configurations x 10 seeds = 3000 trials"
    gpus, cpus = int(options["gpus-per-node"]), int(options["cpus-per-task"])
    assert cpus >= round(gpus / 0.1) * 1 + 1, "ten trials of one CPU per GPU, and the driver's"
    warning = int(re.fullmatch(r"B:USR1@(\d+)", options["signal"]).group(1))
    margin = int(re.search(r"^MARGIN_S=\$\{MARGIN_S:-(\d+)\}$", text, flags=re.M).group(1))
    assert margin > warning, "the budget ends the sweep before SLURM's warning"
    assert "requeue" in options and 'scontrol requeue "$SLURM_JOB_ID"' in text


def test_apptainer_image_is_the_dockerfiles_gpu_image():
    text = (DOCKER / "slurm" / "leaner-clustering.def").read_text()
    assert re.search(rf"^Bootstrap: docker-daemon\nFrom: {IMAGE}:{{{{ TAG }}}}$", text, flags=re.M)
    assert "%arguments" not in text, "no default TAG: the build names the commit's image"
    assert "apptainer build --build-arg TAG=gpu-$GIT_COMMIT " in CLUSTER_DOC.read_text()
    assert "RUN=${RUN-apptainer exec --nv $IMAGE}" in SBATCH.read_text()
