"""The device a model trains on: train.device on this machine, and what a run records of it."""

from __future__ import annotations

import torch

from config.schema import ConfigError


def pick_device(name: str, key: str = "train.device") -> torch.device:
    """The device `name` (auto: CUDA when present) on this machine; ConfigError naming `key` when this
    machine lacks it (torch would fail later, at the first tensor moved there)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (device.index or 0) >= count:
            allowed = f"cpu, auto, cuda or cuda:0 to cuda:{count - 1}" if count else "cpu or auto"
            raise ConfigError(
                f"{key}={name} is not allowed on this machine, which has {count} visible CUDA devices: "
                f"choose {allowed}"
            )
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(
            f"{key}={name} is not allowed on this machine, which has no MPS: choose cpu or auto"
        )
    return device


def cuda_index(device: torch.device) -> int:
    """The index of CUDA `device`; pick_device's cuda has none, which means the current device, and calls such
    as torch.cuda.set_per_process_memory_fraction refuse a device without one."""
    return torch.cuda.current_device() if device.index is None else device.index


def gpu_model(device: torch.device) -> str | None:
    """The model of the GPU `device` is (a run's gpu_model tag); None off CUDA."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else None
