"""docker/: the images, the tracking stack, the Ray cluster launcher config and the KubeRay job.

No Docker engine or Kubernetes cluster runs here, so the files are checked
statically against what they must agree with (the Makefile, the project's
environment, Ray's own launcher schema, KubeRay's v1 API fields), their sweep
commands are run as dry runs, and the compose file's MLflow server command is
run for real on 127.0.0.1 (SQLite standing in for PostgreSQL).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
import urllib.error
import urllib.request
from importlib.metadata import version
from pathlib import Path

import pytest
import yaml

from conftest import free_port, stop_group
from sweeper import sweep as sweep_cli

ROOT = Path(__file__).resolve().parent.parent
DOCKER = ROOT / "docker"
IMAGE = "leaner-clustering"  # the tags docker/Dockerfile's header builds: leaner-clustering:gpu / :cpu


def dockerfile_lines(name: str = "Dockerfile") -> list[str]:
    """Instructions of a Dockerfile with continuation lines joined, comments dropped."""
    text = (DOCKER / name).read_text()
    text = re.sub(r"\\\n", " ", "\n".join(l for l in text.splitlines() if not l.lstrip().startswith("#")))
    return [" ".join(l.split()) for l in text.splitlines() if l.strip()]


def runs_of(lines: list[str]) -> list[str]:
    return [l for l in lines if l.startswith("RUN ")]


def makefile_recipe(target: str) -> list[str]:
    lines = (ROOT / "Makefile").read_text().splitlines()
    start = next(i for i, l in enumerate(lines) if re.match(rf"^{re.escape(target)}\s*:", l))
    recipe = []
    for line in lines[start + 1:]:
        if not line.startswith("\t"):
            break
        if not line.strip().startswith("#"):
            recipe.append(line.strip())
    return recipe


def env_example() -> dict[str, str]:
    pairs = [l.split("=", 1) for l in (DOCKER / ".env.example").read_text().splitlines()
             if l.strip() and not l.startswith("#")]
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


def override(args: list[str], key: str) -> str | None:
    values = [a.split("=", 1)[1] for a in args if a.startswith(f"{key}=")]
    return values[-1] if values else None


# --- images -----------------------------------------------------------------------------


def test_dockerfile_installs_what_the_makefile_installs():
    lines = dockerfile_lines()
    install = next(r for r in runs_of(lines) if "make install" in r)
    # The image runs the Makefile's own target, so its pins are the Makefile's by construction...
    recipe = makefile_recipe("$(STAMP)")
    assert any(re.search(r"pip install -q torch==2\.13\.0$", l) for l in recipe), recipe
    assert any(l.endswith("pip install -q -e '.[dev]'") for l in recipe), recipe
    assert (ROOT / "Makefile").read_text().count("install: $(STAMP)") == 1
    # ...and the one addition is the `cluster` extra, which pyproject.toml defines.
    extra = re.findall(r"pip install -q -e '\.\[(\w+)\]'", install)
    assert extra == ["cluster"], install
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^cluster = \["ray\[default\]', pyproject, re.M)
    # The host's .venv must not enter the build context: `make install` would reuse it.
    ignored = (DOCKER / "Dockerfile.dockerignore").read_text().split()
    assert ".venv" in ignored and "docker/.env" in ignored


def test_dockerfile_runs_as_non_root_with_cuda_and_cpu_variants():
    lines = dockerfile_lines()
    keywords = {"ARG", "FROM", "RUN", "USER", "WORKDIR", "COPY", "ENV", "ENTRYPOINT", "CMD"}
    assert {l.split()[0] for l in lines} <= keywords, "an instruction or a line continuation is broken"
    users = [l.split()[1] for l in lines if l.startswith("USER ")]
    assert users and users[-1] not in ("root", "0")
    first_copy = next(i for i, l in enumerate(lines) if l.startswith("COPY "))
    assert any(l.startswith("USER ") for l in lines[:first_copy]), "the project must be installed as the user"
    base = next(l for l in lines if l.startswith("ARG BASE_IMAGE="))
    assert base.split("=", 1)[1].startswith("nvidia/cuda:")
    assert "FROM ${BASE_IMAGE}" in lines and "ARG TORCH_INDEX=\"\"" in lines
    header = (DOCKER / "Dockerfile").read_text()
    assert f"-t {IMAGE}:gpu" in header and f"-t {IMAGE}:cpu" in header
    assert "--build-arg TORCH_INDEX=https://download.pytorch.org/whl/cpu" in header
    # The venv comes first on PATH, also for login shells (KubeRay's `bash -lc`, `ray exec`).
    assert any(l.startswith("ENV PATH=/app/.venv/bin:") for l in lines)
    assert any("/etc/profile.d/" in l and "/app/.venv/bin" in l for l in runs_of(lines))


def test_mlflow_server_image_pins_the_clients_mlflow():
    lines = dockerfile_lines("Dockerfile.mlflow")
    pinned = next(l for l in lines if l.startswith("ARG MLFLOW_VERSION=")).split("=", 1)[1]
    assert pinned == version("mlflow"), "server and clients should run the same MLflow"
    assert any('"mlflow[auth]==${MLFLOW_VERSION}"' in l and "psycopg2-binary==" in l for l in lines)
    assert [l.split()[1] for l in lines if l.startswith("USER ")][-1] not in ("root", "0")
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    assert compose["services"]["mlflow"]["image"].endswith(f":{pinned}")


# --- tracking stack -------------------------------------------------------------------


def test_compose_binds_to_loopback_and_takes_credentials_from_the_env_file():
    text = (DOCKER / "compose.yaml").read_text()
    compose = yaml.safe_load(text)
    services = compose["services"]
    assert set(services) == {"postgres", "mlflow"}
    assert "ports" not in services["postgres"], "PostgreSQL stays inside the compose network"
    assert services["mlflow"]["build"] == {"context": "..", "dockerfile": "docker/Dockerfile.mlflow"}
    example = env_example()
    used = set(re.findall(r"\$\{(\w+)", text))
    assert used == set(example), f"documented in .env.example but unused, or used but undocumented: {used ^ set(example)}"
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
    ignored = subprocess.run(["git", "check-ignore", "-q", "docker/.env"], cwd=ROOT)
    assert ignored.returncode == 0, ".gitignore must list docker/.env"


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
def test_compose_mlflow_server_serves_authenticated_runs_and_artifacts(tmp_path):
    """The compose file's MLflow command and environment, on SQLite: basic auth and proxied artifacts."""
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    service = compose["services"]["mlflow"]
    env_file = env_example()
    environment = {k: interpolate(str(v), env_file) for k, v in service["environment"].items()}
    assert environment["MLFLOW_BACKEND_STORE_URI"].startswith("postgresql://")
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
    server = subprocess.Popen(command, cwd=server_dir, env={**os.environ, **environment},
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{uri}/health", 300, server)
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{uri}/api/2.0/mlflow/experiments/search?max_results=1", timeout=10)
        assert refused.value.code == 401
        anonymous = subprocess.run([sys.executable, "-m", "sweeper.train", f"tracking.uri={uri}"], cwd=tmp_path,
                                   env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                                   timeout=300)
        assert anonymous.returncode == 4, anonymous.stderr[-2000:]
        assert "refused access (401)" in anonymous.stderr + anonymous.stdout and uri in anonymous.stderr + anonymous.stdout
        user, password = environment["MLFLOW_AUTH_ADMIN_USERNAME"], environment["MLFLOW_AUTH_ADMIN_PASSWORD"]
        client_env = {**os.environ, "MLFLOW_TRACKING_USERNAME": user, "MLFLOW_TRACKING_PASSWORD": password,
                      "PYTHONPATH": str(ROOT)}
        train = subprocess.run(
            [sys.executable, "-m", "sweeper.train", f"tracking.uri={uri}", "tracking.experiment=compose",
             "train.steps=4", "train.eval_every=2", "task.n=16", "train.batch=4", "train.val_batches=1",
             f"train.workdir={tmp_path / 'runs'}"],
            cwd=tmp_path, env=client_env, capture_output=True, text=True, timeout=300)
        assert train.returncode == 0, train.stderr[-2000:]
        run_id = re.search(r"run ([0-9a-f]{32})", train.stdout).group(1)
        os.environ.update({"MLFLOW_TRACKING_USERNAME": user, "MLFLOW_TRACKING_PASSWORD": password})
        from mlflow.tracking import MlflowClient

        from sweeper.metrics import CHECKPOINT_DIR, CONFIG_ARTIFACT, CURVE_ARTIFACT, OUTCOME

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


# --- Ray cluster launcher ---------------------------------------------------------------


def launcher_config() -> dict:
    return yaml.safe_load((DOCKER / "ray-cluster.yaml").read_text())


def test_ray_cluster_yaml_passes_rays_own_validation():
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = launcher_config()
    validate_config(prepare_config(config))  # what `ray up` runs first; raises on any unknown key
    assert image_tag(config["docker"]["image"]) == f"{IMAGE}:gpu"
    head = " ".join(config["head_start_ray_commands"])
    assert "--dashboard-host=127.0.0.1" in head, "the dashboard and its job API stay on the head's loopback"
    options = config["docker"]["run_options"]
    assert "--env RAY_AUTH_MODE=token" in options, "Ray's token authentication on every node"
    token = next(o.split("=", 1)[1] for o in options if o.startswith("--env RAY_AUTH_TOKEN_PATH="))
    assert token.startswith("/shared/secrets/")
    mounts = [o for o in config["docker"]["run_options"] if o.startswith("--volume ")]
    assert "--volume /shared:/shared" in mounts
    assert all("env-file" not in o for o in config["docker"]["run_options"]), "only the driver needs MLflow secrets"


def launcher_sweep_commands() -> list[list[str]]:
    """The sweep commands the file's header tells to run with `ray exec`."""
    found = []
    for line in (DOCKER / "ray-cluster.yaml").read_text().splitlines():
        match = re.match(r"#\s+ray exec docker/ray-cluster\.yaml (?:--tmux )?\"(.*)\"$", line)
        if match:
            found.append(match.group(1))
    return [shlex.split(cmd.split("&&", 1)[1]) for cmd in found if "sweeper.sweep" in cmd]


def test_ray_cluster_sweep_command_is_valid(capsys):
    commands = launcher_sweep_commands()
    assert len(commands) == 1
    args = commands[0]
    out = dry_run(args, capsys)
    assert out.strip().splitlines()[-1] == "300 configurations x 10 seeds = 3000 trials"
    assert override(args, "cluster.address") == "auto"
    assert override(args, "cluster.storage").startswith("/shared/"), "checkpoints must be on the shared mount"
    # The driver runs on the head, in the container that shares the host's network: the tracking
    # stack of docker/compose.yaml publishes its port on the head's loopback.
    assert override(args, "tracking.uri") == "http://127.0.0.1:5000"
    workdir = next(l for l in dockerfile_lines() if l.startswith("WORKDIR ")).split()[1]
    assert f"cd {workdir} &&" in (DOCKER / "ray-cluster.yaml").read_text()


# --- KubeRay ----------------------------------------------------------------------------

# Field names of KubeRay's ray.io/v1 API (rayjob_types.go, raycluster_types.go): a typo here
# would be dropped silently by `kubectl apply` and the cluster would run without it.
RAYJOB_SPEC = {"activeDeadlineSeconds", "backoffLimit", "rayClusterSpec", "submitterPodTemplate", "metadata",
               "clusterSelector", "submitterConfig", "managedBy", "deletionStrategy", "entrypoint",
               "runtimeEnvYAML", "jobId", "submissionMode", "entrypointResources", "entrypointNumCpus",
               "entrypointNumGpus", "ttlSecondsAfterFinished", "shutdownAfterJobFinishes", "suspend", "schedule"}
RAYCLUSTER_SPEC = {"suspend", "managedBy", "autoscalerOptions", "headServiceAnnotations", "enableInTreeAutoscaling",
                   "gcsFaultToleranceOptions", "headGroupSpec", "rayVersion", "workerGroupSpecs", "upgradeStrategy",
                   "historyServerOptions", "networkPolicy", "tlsOptions"}
HEAD_GROUP = {"template", "headService", "enableIngress", "rayStartParams", "serviceType"}
WORKER_GROUP = {"suspend", "groupName", "replicas", "minReplicas", "maxReplicas", "idleTimeoutSeconds",
                "rayStartParams", "template", "scaleStrategy", "numOfHosts"}


def kuberay_documents() -> dict[str, dict]:
    docs = list(yaml.safe_load_all((DOCKER / "kuberay-rayjob.yaml").read_text()))
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
    assert cluster["rayVersion"] == version("ray"), "rayVersion should be the Ray the images install"
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]

    storage = override(shlex.split(spec["entrypoint"]), "cluster.storage")
    uid = next(l for l in dockerfile_lines() if l.startswith("ARG UID=")).split("=", 1)[1]
    pods = [("head", cluster["headGroupSpec"]["template"]["spec"])]
    pods += [(g["groupName"], g["template"]["spec"]) for g in cluster["workerGroupSpecs"]]
    for name, pod in pods:
        assert pod["securityContext"]["runAsNonRoot"] and str(pod["securityContext"]["runAsUser"]) == uid, name
        volumes = {v["name"]: v for v in pod["volumes"]}
        (container,) = pod["containers"]
        assert image_tag(container["image"]) == f"{IMAGE}:gpu", name
        mounted = [m for m in container["volumeMounts"] if storage.startswith(m["mountPath"].rstrip("/") + "/")]
        assert mounted, f"{name}: cluster.storage={storage} is not on a mounted volume"
        claim_name = volumes[mounted[0]["name"]]["persistentVolumeClaim"]["claimName"]
        assert claim_name == claim["metadata"]["name"], name
        secrets = [e["secretRef"]["name"] for e in container.get("envFrom", [])]
        assert secrets == (["mlflow-credentials"] if name == "head" else []), name
    for group in cluster["workerGroupSpecs"]:
        limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
        assert int(limits["nvidia.com/gpu"]) >= 1


def test_rayjob_entrypoint_is_a_valid_paper_sweep(capsys):
    args = shlex.split(kuberay_documents()["RayJob"]["spec"]["entrypoint"])
    out = dry_run(args, capsys)
    assert out.strip().splitlines()[-1] == "300 configurations x 10 seeds = 3000 trials"
    assert override(args, "sweep") == "paper" and override(args, "cluster.address") == "auto"
    assert override(args, "tracking.uri").startswith("http"), "the driver on the head writes to a server"
