"""What a training process takes of its machine, sampled at its reports: CPU, memory and, on CUDA, its GPU.

MLflow's own monitor (mlflow.system_metrics) samples from a thread of the process that holds the run; a
sweep's trials hold no run (the driver writes their runs, sweeper.driver.writer), so each trial samples here
at every report and its samples travel with the report's points, under MLflow's names (tracking.names), at the
training step. `python -m sweeper.train` samples at each evaluation the same way.

GPU figures come from NVML through pynvml (the optional `gpu` extra: nvidia-ml-py). Without it, or
without an NVIDIA driver, a sample holds CPU and memory only, and `no_gpu` says why.
"""

from __future__ import annotations

import os

import psutil
import torch

from tracking.names import (
    CPU_UTILIZATION,
    GPU_MEMORY_MB,
    GPU_MEMORY_PERCENT,
    GPU_UTILIZATION,
    PROCESS_CPU,
    PROCESS_RSS_MB,
    SYSTEM_MEMORY_MB,
    SYSTEM_MEMORY_PERCENT,
)

MB = 1e6  # MLflow's monitor divides bytes by 1e6 for its *_megabytes


def nvml_id(visible: str | None, index: int) -> int | str:
    """The NVML id of CUDA's visible device `index`: its physical index, or the UUID that names it.

    visible: CUDA_VISIBLE_DEVICES (Ray sets it to the GPUs a trial reserves; None: every GPU is visible, in
    NVML's order). CUDA numbers the visible devices from 0, NVML the physical ones.
    """
    if visible is None:
        return index
    entries = [entry.strip() for entry in visible.split(",") if entry.strip()]
    if index >= len(entries):
        raise ValueError(f"CUDA device {index} is not among CUDA_VISIBLE_DEVICES={visible!r}")
    entry = entries[index]
    return int(entry) if entry.isdigit() else entry


class SystemSampler:
    """Samples the machine's and this process's CPU and memory, and `device`'s GPU when it is CUDA."""

    def __init__(self, device: torch.device) -> None:
        self.process = psutil.Process()
        # The first call of each starts the interval the next one measures.
        psutil.cpu_percent(interval=None)
        self.process.cpu_percent(interval=None)
        self.nvml, self.gpu, self.gpu_index, self.no_gpu = None, None, None, None
        if device.type == "cuda":
            self._open_gpu(device.index or 0)

    def _open_gpu(self, index: int) -> None:
        try:
            import pynvml
        except ImportError:
            self.no_gpu = "pynvml is not installed (pip install 'leaner-clustering[gpu]')"
            return
        try:
            pynvml.nvmlInit()
            target = nvml_id(os.environ.get("CUDA_VISIBLE_DEVICES"), index)
            if isinstance(target, int):
                self.gpu = pynvml.nvmlDeviceGetHandleByIndex(target)
            else:
                self.gpu = pynvml.nvmlDeviceGetHandleByUUID(target)
            self.gpu_index = pynvml.nvmlDeviceGetIndex(self.gpu)
            self.nvml = pynvml
        except (pynvml.NVMLError, ValueError) as err:
            self.gpu, self.no_gpu = None, f"NVML cannot read the GPU: {err}"

    def sample(self) -> dict[str, float]:
        """One sample: the CPU figures since the previous one, memory and the GPU now."""
        memory = psutil.virtual_memory()
        out = {
            CPU_UTILIZATION: psutil.cpu_percent(interval=None),
            SYSTEM_MEMORY_MB: memory.used / MB,
            SYSTEM_MEMORY_PERCENT: memory.used / memory.total * 100,
            PROCESS_CPU: self._process_cpu(),
            PROCESS_RSS_MB: self.process.memory_info().rss / MB,
        }
        if self.gpu is not None:
            out.update(self._gpu_sample())
        return out

    def _process_cpu(self) -> float:
        """The process's CPU since the previous sample, 100 per busy core. Over a short interval (the first
        sample of a run, a test) psutil's clock ticks can round it past what the cores allow (204% on 2
        cores was seen): it is held at that bound."""
        return min(self.process.cpu_percent(interval=None), 100.0 * (psutil.cpu_count() or 1))

    def _gpu_sample(self) -> dict[str, float]:
        nvml, i = self.nvml, self.gpu_index
        try:
            memory = nvml.nvmlDeviceGetMemoryInfo(self.gpu)
            busy = nvml.nvmlDeviceGetUtilizationRates(self.gpu).gpu
        except nvml.NVMLError:  # e.g. a GPU fallen off the bus: the sample goes on without it
            return {}
        return {
            GPU_UTILIZATION.format(index=i): float(busy),
            GPU_MEMORY_MB.format(index=i): memory.used / MB,
            GPU_MEMORY_PERCENT.format(index=i): memory.used / memory.total * 100,
        }
