"""Devices and GPUs, shown on a CPU: the settings refused before any job starts, a trial's GPU and its share
of it, deterministic mode's CUDA settings and a run's GPU model, RNG states resumed onto the GPUs a node has,
and the system metrics a run shows in MLflow's System tab.

Where CUDA itself is needed, torch.cuda's calls that reach the driver are replaced in-process, and torch's
own Python around them (its checks of the arguments) runs as it is.

Each command is called through its entry function (what its console script runs), one through a real
`python -m` subprocess. The sweep's system metrics are read from the session's smoke store
(tests/conftest.py) with MLflow's client.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import warnings
import weakref
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
import torch
from mlflow.tracking import MlflowClient
from support.configs import NO_DASHBOARD, SHORT
from support.repo import REPO
from support.sweeps import children

from bench.gpu import check_memory_cap
from bench.pack import Plan, isolated_peaks, pack_models, pack_step
from cli import exit_codes
from config.compose import compose
from config.grid import compose_one
from config.run import RunSpec
from sweeper import sweep, train
from tracking.names import (
    CPU_UTILIZATION,
    GPU_MODEL,
    PROCESS_CPU,
    PROCESS_RSS_MB,
    SYSTEM_MEMORY_MB,
    SYSTEM_MEMORY_PERCENT,
    SYSTEM_METRICS,
    VAL_REL_LLOYD,
)
from tracking.recorder import MemoryRecorder
from training import determinism, loop
from training.checkpoint import cuda_rng_states
from training.determinism import set_deterministic, warn_if_compiled
from training.device import gpu_model  # the function itself: a test replaces loop's
from training.gpu_share import CONTEXT_BYTES, cap_memory, memory_fraction, trial_device
from training.system_metrics import SystemSampler, nvml_id

CPU_AND_MEMORY = set(SYSTEM_METRICS)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["train.device=cuda"],
            "train.device='cuda' is not allowed: cpu or auto with cluster.gpus_per_trial=0 (Ray hides",
        ),
        (
            ["train.device=cuda:1", "cluster.gpus_per_trial=1"],
            "train.device='cuda:1' is not allowed: cpu, auto or cuda in a sweep: Ray numbers each trial's "
            "GPUs from 0",
        ),
        (
            ["train.device=cuda:0", "cluster.gpus_per_trial=0.5"],
            "train.device='cuda:0' is not allowed: cpu, auto or cuda in a sweep",
        ),
        (
            ["cluster.gpus_per_trial=1.5"],
            "cluster.gpus_per_trial=1.5 is not allowed: a number in [0, 1]: a fraction below 1 shares a GPU, "
            "and a trial trains on one GPU at most",
        ),
        (  # Ray would reserve two whole GPUs, and the trial would train on one
            ["train.device=cuda", "cluster.gpus_per_trial=2"],
            "cluster.gpus_per_trial=2.0 is not allowed: a number in [0, 1]",
        ),
        (
            ["train.compile=cudagraphs"],
            "train.compile='cudagraphs' is not allowed: off, inductor or aot_eager with "
            "cluster.gpus_per_trial=0",
        ),
    ],
)
def test_a_sweep_refuses_devices_its_trials_cannot_have(overrides, message, capsys):
    assert sweep.main(["sweep=smoke", *overrides]) == exit_codes.CONFIG == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {message}"), err


@pytest.mark.parametrize("gpus", ["0.25", "1"])
def test_a_sweep_takes_cuda_with_gpus_reserved(gpus, capsys):
    """Fractions below 1 share a GPU; the driver itself may have no GPU (a CPU head)."""
    args = ["sweep=smoke", "train.device=cuda", f"cluster.gpus_per_trial={gpus}", "sweep.dry_run=true"]
    assert sweep.main(args) == 0
    assert capsys.readouterr().err == ""


LACKING = {  # a trial's reservation this machine cannot give, and the line that refuses it
    "cpus": ("cluster.cpus_per_trial", os.cpu_count() + 1, "CPUs"),
    "gpus": ("cluster.gpus_per_trial", 1, "GPUs"),  # one at most per trial: needs a machine with none
}


@pytest.mark.slow  # a sweep's interpreter (Ray, MLflow)
@pytest.mark.parametrize("lacking", sorted(LACKING))
def test_a_local_sweep_refuses_what_this_machine_lacks_before_any_work(lacking, tmp_path):
    """A local Ray instance (cluster.address null) is this machine: a trial reserving more than it has would
    wait forever, Tune only warning. The sweep exits 2 in one line before Ray starts or the store is made."""
    if lacking == "gpus" and torch.cuda.device_count() > 0:
        pytest.skip("a trial reserves one GPU at most, and this machine has one")
    key, want, what = LACKING[lacking]
    store = tmp_path / "home" / "mlflow.db"
    store.parent.mkdir()
    args = ["sweep=smoke", f"{key}={want}", f"tracking.uri=sqlite:///{store}", NO_DASHBOARD]
    done = subprocess.run(
        [sys.executable, "-m", "sweeper.sweep", *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=120,
    )
    assert done.returncode == exit_codes.CONFIG, done.stderr[-3000:]
    assert done.stderr.strip().splitlines() == [
        f"error: {key}={want:g} is not allowed with a local Ray instance (cluster.address=null): this "
        f"machine has {LACKING['cpus'][1] - 1 if lacking == 'cpus' else 0} {what}; reserve at most that, or "
        "join a cluster that has more (cluster.address)"
    ]
    assert list(store.parent.iterdir()) == []  # no store, no Ray storage: nothing was begun


def test_a_sweep_refused_by_its_cluster_opens_no_parent_run(sqlite_uri):
    """A cluster that refuses the sweep (here: nothing listens at its address) leaves the store's runs as
    they were: no parent run made, none RUNNING."""
    args = ["sweep=smoke", f"tracking.uri={sqlite_uri}", "cluster.address=127.0.0.1:1"]
    assert sweep.main(args) == exit_codes.CLUSTER
    runs = MlflowClient(sqlite_uri).search_runs(
        [e.experiment_id for e in MlflowClient(sqlite_uri).search_experiments()]
    )
    assert runs == []


def test_a_single_run_is_checked_against_its_own_machine(tmp_path: Path, monkeypatch, capsys):
    """sweeper.train ignores the cluster group (cuda with gpus_per_trial 0 composes); a GPU this machine
    lacks is refused before anything is written."""
    assert compose_one(["train.device=cuda"]).cluster.gpus_per_trial == 0
    monkeypatch.chdir(tmp_path)
    missing = torch.cuda.device_count()  # one past the last visible GPU: none on a CPU machine
    assert train.main([f"train.device=cuda:{missing}"]) == exit_codes.CONFIG
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        f"error: train.device=cuda:{missing} is not allowed on this machine"
    )
    assert "choose cpu" in err[0] and list(tmp_path.iterdir()) == []  # no store, no checkpoints


def test_the_sweep_command_exits_2_with_one_line():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "sweeper.sweep", "sweep=smoke", "cluster.gpus_per_trial=1.5"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=120,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        "error: cluster.gpus_per_trial=1.5 is not allowed: a number in [0, 1]: a fraction below 1 shares a "
        "GPU, and a trial trains on one GPU at most"
    ]


CUDA, CPU = torch.device("cuda"), torch.device("cpu")
CURRENT_GPU = 2  # torch.cuda.current_device() under cuda_without_a_driver: not 0, so that it shows where used
GPU_MEMORY = 16 * 2**30  # its devices' memory (a V100's)


def capped(share: float) -> float:
    """A trial's cap on a GPU_MEMORY device: its share less its CUDA context's room."""
    return share - CONTEXT_BYTES / GPU_MEMORY


def test_a_trial_caps_its_memory_at_its_share_of_a_gpu():
    assert memory_fraction(CUDA, 0.1, GPU_MEMORY) == capped(0.1) and 0.05 < capped(0.1) < 0.1
    assert memory_fraction(CUDA, 0.5, GPU_MEMORY) == capped(0.5)
    assert (
        memory_fraction(CUDA, 1, GPU_MEMORY) is None and memory_fraction(CUDA, 2, GPU_MEMORY) is None
    )  # whole
    assert memory_fraction(CUDA, 0, GPU_MEMORY) is None and memory_fraction(CPU, 0.5, GPU_MEMORY) is None


@pytest.fixture
def cuda_without_a_driver(monkeypatch) -> dict[int, float]:
    """torch.cuda.set_per_process_memory_fraction as torch runs it, its check of the device included, with
    the two calls that need a driver replaced: CUDA's start (nothing) and the allocator's setting (recorded).
    Returns the fractions set, by device index; the current device is CURRENT_GPU, each of GPU_MEMORY."""
    fractions: dict[int, float] = {}
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda device: SimpleNamespace(total_memory=GPU_MEMORY)
    )
    monkeypatch.setattr(torch.cuda.memory, "_lazy_init", lambda: None)
    monkeypatch.setattr(
        torch._C, "_cuda_setMemoryFraction", lambda f, index: fractions.update({index: f}), raising=False
    )
    monkeypatch.setattr(torch.cuda, "current_device", lambda: CURRENT_GPU)
    return fractions


def test_a_trial_sharing_a_gpu_caps_the_current_device(cuda_without_a_driver):
    """pick_device's cuda has no index, which torch's call refuses (every trial sharing a GPU crashed at its
    start): the cap goes to the current device, or to the index a device names."""
    with pytest.raises(ValueError, match="Expected a torch.device with a specified index or an integer"):
        torch.cuda.set_per_process_memory_fraction(0.1, CUDA)
    assert cap_memory(CUDA, 0.1) == capped(0.1) and cuda_without_a_driver == {CURRENT_GPU: capped(0.1)}
    assert cap_memory(torch.device("cuda:1"), 0.25) == capped(0.25) and cuda_without_a_driver[1] == capped(
        0.25
    )
    assert cap_memory(CUDA, 1.0) is None and cap_memory(CPU, 0.5) is None
    assert cuda_without_a_driver == {CURRENT_GPU: capped(0.1), 1: capped(0.25)}


def test_bench_gpu_caps_and_lifts_a_trials_share_on_cuda(cuda_without_a_driver, monkeypatch):
    """`python -m bench gpu`'s memory_cap on CUDA, against an allocator that keeps to the fraction set: within
    the cap an allocation succeeds, beyond it one fails, and the cap is lifted on the same device after."""
    total = GPU_MEMORY

    def empty(size: int, dtype: torch.dtype, device: torch.device) -> object:
        assert device == CUDA and dtype == torch.uint8
        if size > cuda_without_a_driver[CURRENT_GPU] * total:
            raise torch.OutOfMemoryError("CUDA out of memory (the stand-in allocator's cap)")
        return object()

    monkeypatch.setattr(torch, "empty", empty)
    assert check_memory_cap(CUDA, 0.25) == {
        "ok": True,
        "share": 0.25,
        "cap_bytes": int(capped(0.25) * total),
        "beyond_cap_refused": True,
    }
    assert cuda_without_a_driver == {CURRENT_GPU: 1.0}  # lifted


def driver_too_old() -> None:
    raise RuntimeError(
        "The NVIDIA driver on your system is too old (found version 11040).\nPlease update your GPU driver."
    )


def test_a_trial_that_reserved_a_gpu_trains_on_it_or_fails_saying_why(monkeypatch):
    """CUDA that does not initialise: a trial with a GPU reserved and train.device auto or cuda fails in one
    line with torch's reason, instead of training on the CPU while it holds the GPU."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "init", driver_too_old)
    for name, share in (("auto", 0.1), ("cuda", 1.0)):
        with pytest.raises(RuntimeError) as failed:
            trial_device(name, share)
        assert str(failed.value) == (
            f"this trial reserved cluster.gpus_per_trial={share:g} of a GPU, but CUDA is unavailable on its "
            f"node (train.device={name} would train on the CPU): The NVIDIA driver on your system is too old "
            "(found version 11040). Please update your GPU driver."
        )
    assert trial_device("auto", 0) == CPU  # no GPU reserved: auto is the CPU here
    assert (
        trial_device("cpu", 0.5) == CPU
    )  # asked for: GPUs declared but absent (tests/test_sweep_cluster.py)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert trial_device("auto", 0.1) == CUDA and trial_device("cuda", 1.0) == CUDA


def test_deterministic_mode_sets_tf32_off_and_back_as_found(monkeypatch):
    """TF32 as the process found it, here as TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 leaves it (on for both)."""
    tf32 = torch.backends.cuda.matmul, torch.backends.cudnn
    before = [torch.are_deterministic_algorithms_enabled()] + [b.allow_tf32 for b in tf32]
    monkeypatch.setenv("TORCHINDUCTOR_DETERMINISTIC", os.environ.get("TORCHINDUCTOR_DETERMINISTIC", "1"))
    monkeypatch.setattr(determinism, "_TF32_FOUND", (True, True))
    try:
        set_deterministic(True)
        assert [b.allow_tf32 for b in tf32] == [False, False]
        set_deterministic(False)
        assert [b.allow_tf32 for b in tf32] == [True, True]
    finally:
        set_deterministic(before[0])
        tf32[0].allow_tf32, tf32[1].allow_tf32 = before[1:]


def test_a_deterministic_cuda_run_compiled_warns_that_its_repeat_is_unchecked():
    with pytest.warns(UserWarning) as caught:
        warn_if_compiled("cudagraphs", True, CUDA)
    assert str(caught[0].message) == (
        "train.compile=cudagraphs with train.deterministic=true on CUDA: python -m bench gpu checks that "
        "eager runs repeat bit for bit, not compiled ones; compare two runs before relying on it"
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_if_compiled("off", True, CUDA)
        warn_if_compiled("inductor", False, CUDA)
        warn_if_compiled("inductor", True, CPU)


def test_a_run_is_tagged_with_its_gpu_model(monkeypatch, tiny, tmp_path):
    """Deterministic runs repeat on the same GPU model, not across models: a run names its model (none on a
    CPU). The run opens on this CPU with a stand-in model name; the name on CUDA is torch's."""
    recorder = MemoryRecorder()
    loop.open_run(RunSpec.of(compose(tiny)), recorder, tmp_path / "cpu")
    assert GPU_MODEL not in recorder.tags
    monkeypatch.setattr(loop, "gpu_model", lambda device: f"stand-in GPU for the {device.type} device")
    recorder = MemoryRecorder()
    loop.open_run(RunSpec.of(compose(tiny)), recorder, tmp_path / "stand-in")
    assert recorder.tags[GPU_MODEL] == "stand-in GPU for the cpu device"
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: f"NVIDIA H200 ({device})")
    assert gpu_model(CUDA) == "NVIDIA H200 (cuda)" and gpu_model(CPU) is None


def test_cuda_rng_states_resume_onto_the_gpus_a_node_has():
    """Synthetic per-GPU states (RNG states are byte tensors; their content does not matter here)."""
    saved = [torch.full((8,), i, dtype=torch.uint8) for i in range(4)]  # four GPUs, the run on GPU 2

    def mapped(saved_device, visible, device) -> dict[int, int]:
        return {i: int(s[0]) for i, s in cuda_rng_states(saved, saved_device, visible, device).items()}

    assert mapped(2, 1, 0) == {0: 2}  # one GPU now: the training GPU's state goes with training
    assert mapped(2, 4, 2) == {0: 0, 1: 1, 2: 2, 3: 3}  # the same node: every state where it was
    assert mapped(0, 8, 5) == {0: 0, 1: 1, 2: 2, 3: 3, 5: 0}  # more GPUs: the run moved to GPU 5
    assert mapped(None, 2, 0) == {0: 0, 1: 1}  # a checkpoint without the index: by index, the rest dropped
    assert mapped(2, 2, None) == {0: 0, 1: 1}  # training on the CPU now: the GPUs keep their own
    assert mapped(2, 0, None) == {}  # no GPU at all
    assert cuda_rng_states([], None, 2, 0) == {}  # a CPU checkpoint resumed on a GPU


def test_nvml_ids_follow_cuda_visible_devices():
    assert nvml_id(None, 1) == 1  # every GPU visible: NVML's order
    assert nvml_id("2,3", 1) == 3  # Ray gave the trial physical GPUs 2 and 3
    assert nvml_id("GPU-5d1c, GPU-77ab", 0) == "GPU-5d1c"
    with pytest.raises(ValueError, match="CUDA device 1 is not among"):
        nvml_id("4", 1)


def assert_sane(sample: dict[str, float]) -> None:
    total_mb = psutil.virtual_memory().total / 1e6
    assert 0 <= sample[CPU_UTILIZATION] <= 100 and 0 < sample[SYSTEM_MEMORY_PERCENT] < 100
    assert 0 < sample[SYSTEM_MEMORY_MB] < total_mb
    assert 0 <= sample[PROCESS_CPU] <= 100 * psutil.cpu_count()
    assert 50 < sample[PROCESS_RSS_MB] < total_mb  # a process that imported torch


@pytest.mark.parametrize("binding", ["absent", "without a driver"])
def test_the_gpu_sampler_without_nvml_samples_cpu_and_memory(binding, monkeypatch):
    """On CUDA without the NVML binding (the optional `gpu` extra), or with it but no NVIDIA driver (this
    CPU machine), a sample holds the CPU and memory figures, and the sampler says why no GPU ones."""
    if binding == "absent":
        monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    elif torch.cuda.is_available():
        pytest.skip("this machine has an NVIDIA driver")
    else:
        pytest.importorskip("pynvml")
    sampler = SystemSampler(torch.device("cuda"))
    sum(i * i for i in range(200_000))  # some CPU time to measure
    sample = sampler.sample()
    assert set(sample) == CPU_AND_MEMORY
    assert_sane(sample)
    assert (
        "pynvml is not installed" if binding == "absent" else "NVML cannot read the GPU"
    ) in sampler.no_gpu
    assert SystemSampler(torch.device("cpu")).no_gpu is None  # on the CPU no GPU is missed


def test_a_single_run_logs_system_metrics_at_each_evaluation(tiny, tmp_path, sqlite_uri):
    assert train.main(tiny + [f"tracking.uri={sqlite_uri}", f"train.workdir={tmp_path}"]) == 0
    client = MlflowClient(tracking_uri=sqlite_uri)
    (run,) = client.search_runs([client.get_experiment_by_name("leaner-clustering").experiment_id])
    evaluations = [m.step for m in client.get_metric_history(run.info.run_id, VAL_REL_LLOYD)]
    for key in CPU_AND_MEMORY:
        points = client.get_metric_history(run.info.run_id, key)
        assert sorted(m.step for m in points) == sorted(evaluations), key
    history = {key: client.get_metric_history(run.info.run_id, key) for key in CPU_AND_MEMORY}
    for i in range(len(evaluations)):
        assert_sane({key: points[i].value for key, points in history.items()})


@pytest.mark.slow  # the session's smoke sweep
def test_every_sweep_run_shows_cpu_and_memory_in_the_system_metrics_tab(smoke_store):
    """Each trial samples at each report (cluster.report_every 1: every evaluation) and the driver writes the
    samples into the run under MLflow's system/ names, which its UI's System metrics tab shows."""
    client = MlflowClient(tracking_uri=smoke_store)
    runs = children(smoke_store, "smoke")
    assert runs
    for run in runs:
        evaluations = sorted(m.step for m in client.get_metric_history(run.info.run_id, VAL_REL_LLOYD))
        history = {key: client.get_metric_history(run.info.run_id, key) for key in CPU_AND_MEMORY}
        for key, points in history.items():
            assert sorted(m.step for m in points) == evaluations, (run.info.run_name, key)
        for i in range(len(evaluations)):
            sample = {key: sorted(points, key=lambda m: m.step)[i].value for key, points in history.items()}
            assert_sane(sample)
        assert sorted(history[PROCESS_RSS_MB], key=lambda m: m.timestamp)[-1].value > 100  # torch, a model


@pytest.mark.slow  # the profiler's memory timeline
def test_bench_frees_each_pack_and_measures_each_alone():
    """bench pack (and bench gpu's steps) build each variant's pack alone, measure its peak and free it
    before the next: a dropped step leaves no pack alive (a global cache of packs kept every one before)."""
    cpu = torch.device("cpu")
    cfgs = pack_models(compose(SHORT), Plan({}, (3,), (1,), (), 1), 3)
    step = pack_step(cfgs, cpu)
    step()
    pack = weakref.ref(step.__self__)
    del step
    gc.collect()
    assert pack() is None
    peaks = isolated_peaks(cfgs, Plan({}, (1, 3), (1,), (), 1, memory=True), cpu)
    assert set(peaks) == {"solo", "pack1", "pack3"} and all(p > 0 for p in peaks.values()), peaks
    assert peaks["pack3"] > peaks["pack1"]  # three models' step holds more than one's
