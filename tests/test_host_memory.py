"""Training reuses freed host memory (training.host_memory): a step does not fault its pages in again."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from support.repo import subprocess_env

# Forward and backward of one model on 384 tasks at n 128 (a pack of 12's tensors, a few MB each), in a
# fresh process; prints the minor page faults of a step once warm. With "pack", a training Pack is built
# first, as every training path does.
WORKLOAD = textwrap.dedent(
    """
    import resource, sys, torch
    from config.compose import compose
    from models.transformer import ClusteringTransformer
    from tasks.sampler import sample_tasks
    from tasks.spec import TaskSpec
    from training.fused import Pack
    from config.run import RunSpec
    from training.trainer import Trainer

    torch.set_num_threads(1)
    if sys.argv[1] == "pack":
        Pack([Trainer(RunSpec.of(compose(["task.n=128", "train.device=cpu"])), torch.device("cpu"))])
    model = ClusteringTransformer(4, 6, "onehot", 1.0, 0.01)
    X, C = sample_tasks(TaskSpec(n=128, d=4, k=6), 384, torch.Generator().manual_seed(0))
    for _ in range(3):
        model(X, C).sum().backward()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(10):
        model(X, C).sum().backward()
    print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 10)
    """
)


def faults_per_step(mode: str) -> float:
    done = subprocess.run(
        [sys.executable, "-c", WORKLOAD, mode],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=120,
        check=True,
    )
    return float(done.stdout.split()[-1])


@pytest.mark.slow  # two training subprocesses
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc: Linux only")
def test_a_pack_reuses_freed_memory_instead_of_faulting_it_in_every_step():
    default, reused = faults_per_step("plain"), faults_per_step("pack")
    # Measured on 2 cores: 3,400-6,200 faults a step by default, 120-210 after a Pack turned reuse on.
    assert reused < default / 5, f"{reused:.0f} page faults a step with reuse, {default:.0f} without"
