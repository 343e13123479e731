"""A first sweep on each cluster path: what breaks where the platform meets the image, the nodes and the
scheduler (issue 57). The image (docker/Dockerfile, docker/mlflow/Dockerfile), the KubeRay manifests and the
Ray cluster launcher config are checked statically (no Docker engine, GPU or Kubernetes cluster runs here),
against the facts they must agree with: which drivers a CUDA runs on, what an 8-vCPU GPU node gives its
pods, what an NFS export with root_squash refuses. A trial's GPUs and memory cap are checked on a real local
Ray instance and against the cap's arithmetic. tests/test_deploy.py holds the files' other checks.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from importlib.metadata import distribution, version

import pytest
import torch
import yaml
from omegaconf import OmegaConf
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from support.readme import blocks, commands
from support.repo import REPO

from config.compose import compose_sweep, group_options
from config.grid import flatten
from config.schema import CONF_DIR
from training.gpu_share import CONTEXT_BYTES, memory_fraction

DOCKER = REPO / "docker"
CLUSTER_DOC = REPO / "docs" / "cluster.md"
GiB = 2**30


def dockerfile(name: str = "Dockerfile") -> list[str]:
    """Instructions of a Dockerfile, continuation lines joined, comments dropped."""
    text = "\n".join(l for l in (DOCKER / name).read_text().splitlines() if not l.lstrip().startswith("#"))
    return [" ".join(l.split()) for l in text.replace("\\\n", " ").splitlines() if l.strip()]


def arg_default(lines: list[str], name: str) -> str:
    (line,) = [l for l in lines if l.startswith(f"ARG {name}=")]
    return line.split("=", 1)[1].strip('"')


def section(title: str) -> str:
    """A `## ` section of docs/cluster.md, up to the next one."""
    text = CLUSTER_DOC.read_text()
    start = text.index(f"## {title}")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else None]


# --- the image ------------------------------------------------------------------------------------------


def cuda_of_index(index: str) -> str | None:
    """The CUDA version of a PyTorch wheel index (.../whl/cu128 -> 12.8); None for the CPU index."""
    match = re.search(r"/whl/cu(\d+)(\d)$", index)
    return f"{match.group(1)}.{match.group(2)}" if match else None


def test_the_default_gpu_image_runs_on_common_data_center_drivers_and_v100s():
    """A CUDA 13 base refuses drivers older than 580 at container start, and PyPI's torch (CUDA 13) both
    them and Volta: the default image has a base without CUDA and torch's CUDA 12 build, which drivers from
    525 on run (CUDA 12's minor-version compatibility) on GPUs from compute capability 7.0 (V100)."""
    lines = dockerfile()
    base = arg_default(lines, "BASE_IMAGE")
    assert "cuda" not in base, f"{base}: a torch wheel brings its CUDA; a CUDA base adds its driver check"
    cuda = cuda_of_index(arg_default(lines, "TORCH_INDEX"))
    assert cuda is not None and cuda.startswith("12."), f"torch's CUDA {cuda}: drivers < 580 need CUDA 12"
    # The container toolkit mounts libcuda only for the compute capability, which a plain base must ask for.
    assert "ENV NVIDIA_DRIVER_CAPABILITIES=compute,utility" in lines
    # docs/cluster.md states the matrix, the default's row first, with the V100 on it.
    rows = [r for r in section("Build the image").splitlines() if r.startswith("| GPU")]
    default = rows[0].split("|")
    assert "default" in default[1] and arg_default(lines, "TORCH_INDEX") in default[2]
    assert default[3].strip() == cuda and ">= 525" in default[4] and "V100" in default[5]
    assert any(">= 580" in r and "no V100" in r for r in rows), "the CUDA 13 variant's limits"


def test_no_build_recipe_pairs_a_base_with_another_cudas_torch():
    """The V100 recipe once changed torch's index alone, keeping a CUDA 13 base that refuses its drivers:
    every build command (the Dockerfile's header, the docs) sets no base of its own, or one whose CUDA is its
    torch's."""
    header = (DOCKER / "Dockerfile").read_text().replace("\\\n#", " ")
    docs = [" ".join(c) for b in blocks() for c in commands(b.text)]
    builds = [l for l in header.splitlines() + docs if "docker build -f docker/Dockerfile " in l]
    assert builds
    for build in builds:
        args = dict(re.findall(r"--build-arg (\w+)=(\S*)", build))
        base = args.get("BASE_IMAGE", arg_default(dockerfile(), "BASE_IMAGE"))
        cuda = cuda_of_index(args.get("TORCH_INDEX", arg_default(dockerfile(), "TORCH_INDEX")))
        based = re.search(r"cuda:(\d+\.\d+)", base)
        assert based is None or (cuda and based.group(1) == cuda), build


def test_pip_and_setuptools_are_pinned_in_both_images():
    """The lock pins what pip installs, not pip and setuptools themselves (an `--upgrade pip` builds with
    whatever pip is newest that day)."""
    lines = dockerfile()
    pip = arg_default(lines, "PIP_VERSION")
    setuptools = arg_default(lines, "SETUPTOOLS_VERSION")
    build_requires = tomllib_requires()
    assert setuptools in SpecifierSet(str(build_requires["setuptools"].specifier))
    text = "\n".join(lines)
    assert "--upgrade" not in text
    assert '"pip==${PIP_VERSION}" "setuptools==${SETUPTOOLS_VERSION}"' in text
    mlflow = dockerfile("mlflow/Dockerfile")
    assert arg_default(mlflow, "PIP_VERSION") == pip
    assert '"pip==${PIP_VERSION}"' in "\n".join(mlflow)


def tomllib_requires() -> dict[str, Requirement]:
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    return {Requirement(r).name: Requirement(r) for r in project["build-system"]["requires"]}


def lock() -> dict[str, str]:
    lines = (REPO / "requirements.lock").read_text().splitlines()
    pins = [l.split("==") for l in lines if "==" in l and not l.startswith("#")]
    return {canonical(name): pin for name, pin in pins}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(*requirements: str) -> set[str]:
    """The distributions these requirements install, as this environment resolved them."""
    seen: set[str] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        name = canonical(req.name)
        if name in seen:
            continue
        seen.add(name)
        for dep in map(Requirement, distribution(name).requires or []):
            extras = req.extras or {""}
            if dep.marker is None or any(dep.marker.evaluate({"extra": e}) for e in extras):
                todo.append(dep)
    return seen


def test_the_mlflow_image_installs_every_package_at_the_locks_version():
    """The server's MLflow, Flask, SQLAlchemy, psycopg...: each at the version the tests ran the server with,
    by the lock as pip's constraints (two pins of its own left every other package to the day's PyPI)."""
    lines = dockerfile("mlflow/Dockerfile")
    (install,) = [l for l in lines if "mlflow[auth]" in l]
    assert re.search(r"pip install --no-cache-dir -c (\S*requirements\.lock) ", install), install
    copied = [l for l in lines if l.startswith("COPY requirements.lock ")]
    assert copied and not re.search(r"mlflow\[auth\]==|psycopg\[binary\]==", install), "versions: the lock's"
    packages = re.findall(r'"([\w.-]+\[\w+\])"', install)
    assert packages == ["mlflow[auth]", "psycopg[binary]"]
    pins = lock()
    missing = closure(*packages) - set(pins)
    assert not missing, f"installed unpinned: {sorted(missing)}"
    assert pins["mlflow"] == version("mlflow"), "the server's MLflow is the clients'"


# --- KubeRay --------------------------------------------------------------------------------------------


def manifests(name: str) -> list[dict]:
    return list(yaml.safe_load_all((DOCKER / name).read_text()))


def rayjob() -> dict:
    (job,) = [d for d in manifests("kuberay/rayjob.yaml") if d["kind"] == "RayJob"]
    return job["spec"]


def kubectl_commands() -> list[str]:
    section_text = section("On Kubernetes")
    return [
        " ".join(c) for b in blocks() if b.text in section_text for c in commands(b.text) if "kubectl" in c
    ]


def test_the_volume_claim_outlives_the_rayjob_and_names_its_storage_class():
    """Without storageClassName the default class (ReadWriteOnce on most clusters) leaves every pod Pending
    with no error; in the RayJob's file, deleting the RayJob to start again deleted the checkpoints too."""
    (claim,) = manifests("kuberay/storage.yaml")
    assert claim["kind"] == "PersistentVolumeClaim" and claim["spec"]["accessModes"] == ["ReadWriteMany"]
    placeholder = claim["spec"]["storageClassName"]
    # Not a DNS-1123 subdomain: the API server refuses the file as it is, rather than a claim that waits.
    assert not re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", placeholder), placeholder
    name = claim["metadata"]["name"]
    pods = [rayjob()["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]]
    pods += [g["template"]["spec"] for g in rayjob()["rayClusterSpec"]["workerGroupSpecs"]]
    assert all(
        any(v.get("persistentVolumeClaim", {}).get("claimName") == name for v in p["volumes"]) for p in pods
    )
    kubectl = kubectl_commands()
    storage = next(i for i, c in enumerate(kubectl) if "docker/kuberay/storage.yaml" in c)
    assert kubectl[storage].startswith(f"sed s|{placeholder}|$STORAGE_CLASS| docker/kuberay/storage.yaml")
    job = next(i for i, c in enumerate(kubectl) if "docker/kuberay/rayjob.yaml" in c and " apply " in c)
    assert storage < job, "the claim before the pods that mount it"
    # Going on after a stop: delete the RayJob alone, apply it again.
    assert "kubectl -n leaner-clustering delete rayjob leaner-clustering-paper" in kubectl
    assert not any(" delete " in c and ("kuberay/storage" in c or " pvc" in c) for c in kubectl)


def gpu_groups() -> list[dict]:
    groups = rayjob()["rayClusterSpec"]["workerGroupSpecs"]
    gpu = [
        g for g in groups if "nvidia.com/gpu" in g["template"]["spec"]["containers"][0]["resources"]["limits"]
    ]
    assert gpu, "the RayJob has GPU workers"
    return gpu


# Field names of a Kubernetes Toleration (core/v1): a typo is dropped silently by `kubectl apply`.
TOLERATION = {"key", "operator", "value", "effect", "tolerationSeconds"}


def test_gpu_workers_tolerate_the_gpu_nodes_taint():
    """GKE, AKS and EKS's GPU node groups taint GPU nodes nvidia.com/gpu:NoSchedule: without a toleration
    the workers stay Pending."""
    for group in gpu_groups():
        tolerations = group["template"]["spec"].get("tolerations", [])
        assert all(set(t) <= TOLERATION for t in tolerations), tolerations
        assert any(
            t["key"] == "nvidia.com/gpu"
            and t.get("effect", "NoSchedule") == "NoSchedule"
            and (t.get("operator") == "Exists" or "value" in t)
            for t in tolerations
        ), (group["groupName"], tolerations)


def quantity(text: str) -> float:
    """A Kubernetes quantity: CPUs ("7", "500m") or bytes ("24Gi")."""
    units = {"m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "": 1}
    number, unit = re.fullmatch(r"([\d.]+)(m|Ki|Mi|Gi|)", str(text)).groups()
    return float(number) * units[unit]


def gke_allocatable(cpus: int, memory: float) -> tuple[float, float]:
    """What a node gives pods by GKE's documented reservation (the strictest of GKE, EKS and AKS for small
    nodes): CPU 6% of the first core, 1% of the second, 0.5% of the next two, 0.25% above; memory 25% of
    the first 4 GiB, 20% of the next 4, 10% of the next 8, 6% of the next 112, and a 100 MiB eviction
    threshold."""
    cpu_rates = [0.06, 0.01, 0.005, 0.005] + [0.0025] * (cpus - 4)
    tiers = [(4 * GiB, 0.25), (4 * GiB, 0.20), (8 * GiB, 0.10), (112 * GiB, 0.06)]
    reserved, left = 0.0, memory
    for size, rate in tiers:
        reserved += min(left, size) * rate
        left -= min(left, size)
    return cpus - sum(cpu_rates[:cpus]), memory - reserved - 100 * 2**20


# The node's DaemonSets (NVIDIA's device plugin, a logging agent, kube-proxy, a CSI node plugin) request
# CPU and memory of it too: about this much on the managed clusters' GPU nodes.
DAEMONSETS = (0.4, 1 * GiB)


def test_gpu_workers_fit_a_common_single_gpu_node_of_8_vcpus():
    """g4dn/g5/g6.2xlarge and g2-standard-8: 8 vCPUs, 32 GiB, one GPU. A worker asking for 10 CPUs was
    Pending on all of them; it must still give Ray the CPUs for ten trials per GPU."""
    cpu_room, memory_room = gke_allocatable(8, 32 * GiB)
    cluster = compose_sweep(shlex.split(rayjob()["entrypoint"])[3:]).cluster  # its backend's file included
    for group in gpu_groups():
        (container,) = group["template"]["spec"]["containers"]
        requests = container["resources"]["requests"]
        assert quantity(requests["cpu"]) <= cpu_room - DAEMONSETS[0], (requests, cpu_room)
        assert quantity(requests["memory"]) <= memory_room - DAEMONSETS[1], (requests, memory_room / GiB)
        assert int(requests["nvidia.com/gpu"]) == 1
        ray_cpus = float(group["rayStartParams"].get("num-cpus", requests["cpu"]))
        trials = round(1 / cluster.gpus_per_trial)
        assert ray_cpus >= trials * cluster.cpus_per_trial, "ten trials on the GPU"


def test_the_ray_cluster_goes_soon_after_the_sweep():
    """ttlSecondsAfterFinished 3600 kept four GPU nodes idle for an hour after every sweep."""
    spec = rayjob()
    assert spec["shutdownAfterJobFinishes"] is True
    assert 0 <= spec["ttlSecondsAfterFinished"] <= 300


# --- the Ray cluster launcher ---------------------------------------------------------------------------


def launcher() -> dict:
    return yaml.safe_load((DOCKER / "launcher" / "ray-cluster.yaml").read_text())


def launcher_commands() -> list[str]:
    config = launcher()
    keys = [k for k in config if k.endswith("_commands")]
    return [c for k in keys for c in config[k]]


def test_the_launcher_runs_no_sudo():
    """An NFS export with root_squash (the usual default) refuses root: `sudo install -d -o 1000 ...` on
    /shared failed every `ray up`."""
    assert launcher_commands() and not any(re.search(r"\bsudo\b", c) for c in launcher_commands())


def test_the_launcher_refuses_a_machine_without_the_shared_folder_naming_the_step(tmp_path):
    """Its initialization command, run here with /shared at tmp_path: a missing folder stops `ray up` on that
    machine with a line naming docs/cluster.md's step that makes it; a present one passes."""
    (command,) = launcher()["initialization_commands"]
    here = command.replace("/shared", str(tmp_path / "shared"))
    missing = subprocess.run(["bash", "-c", here], capture_output=True, text=True)
    assert missing.returncode != 0
    step = re.search(r"On your own machines, step (\d+)", missing.stderr).group(1)
    (tmp_path / "shared" / "ray-results").mkdir(parents=True)
    assert subprocess.run(["bash", "-c", here]).returncode == 0
    steps = numbered_steps(section("On your own machines"))
    assert "/shared/ray-results" in steps[int(step) - 1]


def numbered_steps(text: str) -> list[str]:
    """The items of a section's numbered list (`1. ...` at the line's start, up to the next)."""
    parts = re.split(r"^(\d+)\. ", text, flags=re.M)
    numbers = [int(n) for n in parts[1::2]]
    assert numbers == list(range(1, len(numbers) + 1)), numbers
    return parts[2::2]


@pytest.mark.parametrize(
    "title, prerequisites",
    [
        (
            "On your own machines",
            ["NVIDIA driver", "NVIDIA container toolkit", "docker login", "/shared", "ray-auth-token"],
        ),
        ("On Kubernetes", ["KubeRay operator", "device plugin", "ReadWriteMany", "storageClass"]),
    ],
)
def test_each_path_is_numbered_steps_that_say_how_each_was_checked(title, prerequisites):
    """docs/cluster.md: from nothing to the report, each step naming its check, or saying it was not
    checked; and what never ran here (a GPU, the cluster itself) said plainly."""
    text = section(title)
    steps = numbered_steps(text)
    assert len(steps) >= 6
    for step in steps:
        assert re.search(r"\*(Checked|Not checked)", step), step[:80]
    joined = " ".join(" ".join(steps).split())
    missing = [p for p in prerequisites if p.lower() not in joined.lower()]
    assert not missing, missing
    assert "analysis.report" in steps[-1], "the last step is the report"
    assert re.search(r"no GPU|No Kubernetes cluster", text)


# --- the cluster backends: an option of conf/cluster/ and a folder of docker/ each -----------------------

BACKENDS = group_options("cluster", [])  # conf/cluster/'s options alone, no user config directory
LOCAL = "local"  # the default, a local Ray instance: the one backend without a folder of docker/


def recipes() -> dict[str, list[str]]:
    """Each backend's recipe: the overrides of the sweep command its folder of docker/ runs."""
    sbatch = (DOCKER / "slurm" / "sweep.sbatch").read_text()
    (slurm,) = re.findall(r"^    set -- (sweep=.*)$", sbatch, flags=re.M)  # its default sweep
    (submit,) = [
        l.removeprefix("#")
        for l in (DOCKER / "launcher" / "ray-cluster.yaml").read_text().splitlines()
        if l.startswith("#   ray job submit ")
    ]
    launcher = shlex.split(submit)
    return {
        "slurm": slurm.split(),
        "launcher": launcher[launcher.index("--") + 4 :],  # after `-- python -m sweeper.sweep`
        "kuberay": shlex.split(rayjob()["entrypoint"])[3:],
    }


def backend_file(backend: str) -> dict:
    """The keys a backend's file sets, dotted from the configuration's root (its defaults list left out)."""
    path = CONF_DIR / "cluster" / f"{backend}.yaml"
    written = {k: v for k, v in yaml.safe_load(path.read_text()).items() if k != "defaults"}
    at_root = path.read_text().startswith("# @package _global_\n")
    return flatten(written if at_root else {"cluster": written})


@pytest.mark.parametrize("backend", BACKENDS)
def test_each_cluster_backend_composes_validates_and_sets_what_its_file_says(backend):
    """cluster=NAME composes on the schema and validates as a sweep's Ray trials run it (config/compose.py);
    each key its file sets has that value, and every other cluster key the default's (its defaults list
    takes conf/cluster/local.yaml first, and the file's own keys after it)."""
    cfg = compose_sweep(["sweep=paper", f"cluster={backend}"])
    written = backend_file(backend)
    assert written and {k: OmegaConf.select(cfg, k) for k in written} == written
    local = compose_sweep(["sweep=paper"]).cluster
    rest = {k for k in local if f"cluster.{k}" not in written}
    assert {k: cfg.cluster[k] for k in rest} == {k: local[k] for k in rest}


def test_each_recipe_chooses_its_backend_and_states_none_of_its_keys():
    """Every backend but the local default has a recipe in its folder of docker/, whose sweep command says
    cluster=NAME and sets none of the keys the backend's file holds (they would drift apart again), and every
    sweep command of docs/cluster.md that runs on a cluster names its backend too."""
    written = recipes()
    assert sorted(written) == [b for b in BACKENDS if b != LOCAL], (
        "a backend without a recipe, or the reverse"
    )
    for backend, words in written.items():
        assert (DOCKER / backend).is_dir(), backend
        assert [w for w in words if w.startswith("cluster=")] == [f"cluster={backend}"], (backend, words)
        keys = backend_file(backend)
        assert not [w for w in words if w.split("=", 1)[0] in keys], (backend, words)
    docs = [c for b in blocks() if b.page == CLUSTER_DOC for c in commands(b.text)]
    on_clusters = [
        c
        for c in docs
        if "docker/slurm/sweep.sbatch" in c
        or ("sweeper.sweep" in c and "sweep.dry_run=true" not in c and "sweep=smoke" not in c)
    ]
    assert len(on_clusters) >= 3, on_clusters  # the launcher's, Ray by hand, SLURM's
    for command in on_clusters:
        assert any(w in {f"cluster={b}" for b in written} for w in command), " ".join(command)


# --- a trial's GPUs -------------------------------------------------------------------------------------


@pytest.mark.slow  # a local Ray instance (make test-fast starts none)
def test_a_trial_that_reserves_no_gpu_sees_none(monkeypatch):
    """Ray 2.60 leaves a task that reserves no GPU the node's CUDA_VISIBLE_DEVICES: a trial at
    cluster.gpus_per_trial=0 with train.device=auto trained on GPUs other trials held. On a local Ray
    instance as the sweep starts it, with the node's GPU 0 visible to it."""
    import ray

    from sweeper.driver import cluster

    ray.shutdown()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    cluster.connect(OmegaConf.create({"address": None, "dashboard_host": None}))
    try:
        seen = ray.get(ray.remote(num_gpus=0)(lambda: os.environ.get("CUDA_VISIBLE_DEVICES")).remote())
    finally:
        ray.shutdown()
    assert seen == ""


@pytest.mark.parametrize("total_gib", [16, 24, 40, 80])
@pytest.mark.parametrize("share", [0.1, 0.25, 0.5])
def test_trials_sharing_a_gpu_fit_with_their_cuda_contexts(total_gib, share):
    """Each trial's CUDA context lives outside its allocator's cap: caps of the whole share (ten of 0.1)
    and ten contexts were more than the GPU has."""
    total = total_gib * GiB
    cap = memory_fraction(torch.device("cuda"), share, total) * total
    trials = round(1 / share)
    assert trials * (cap + CONTEXT_BYTES) <= total * (1 + 1e-12)  # float rounding
    assert cap >= share * total - CONTEXT_BYTES - 1, "no more taken than the context's room"


def test_a_share_without_room_for_a_cuda_context_is_refused_in_one_line():
    with pytest.raises(RuntimeError) as refused:
        memory_fraction(torch.device("cuda"), 0.02, 16 * GiB)
    assert "cluster.gpus_per_trial=0.02" in str(refused.value) and "\n" not in str(refused.value)
