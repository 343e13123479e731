"""A pack's steps read nothing back to the host; its read-backs do not grow with the pack (issue 42).

On a GPU a read of a device value waits for the queued work. Here the reads are counted on the CPU by
bench.host_reads (Tensor's reading methods wrapped with counters, and the ATen ops that read on CUDA
seen by a dispatch mode) during training's own Pack.step and Pack.read.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from support.configs import TINY

from bench.host_reads import count_host_reads, pack_reads
from config.compose import compose
from config.run import RunSpec
from tasks.sampler import TaskSpec, sample_tasks
from tasks.spec import INITS
from training.device import pick_device
from training.fused import Pack
from training.trainer import Trainer


def pack_of(models: int, init: str) -> Pack:
    """Without dropout: attention then takes the path it takes on CUDA (scaled_dot_product_attention,
    whose dropout draws on the device), not the CPU's fused dropout (models.flash_dropout, which reads
    the number of dropped pairs to size its sparse pattern)."""
    overrides = [*TINY, f"task.init={init}", "model.dropout=0.0"]
    cfgs = [compose([*overrides, f"seed={seed}"]) for seed in range(1, models + 1)]
    return Pack([Trainer(RunSpec.of(cfg), pick_device(cfg.train.device)) for cfg in cfgs])


@pytest.mark.parametrize("init", INITS)
def test_steps_read_nothing_and_read_backs_do_not_grow_with_the_pack(init: str) -> None:
    one, three = (pack_reads(pack_of(models, init), 21) for models in (1, 3))
    # 21 steps of chunks of 10: draws at steps 1, 11 and 21, read-backs every 5 (train.log_every).
    for counted in (one, three):
        assert counted["draw_steps"] == 3 and counted["read_backs"] == 4
        assert counted["reads_in_steps"] == 0  # draw steps included
        # Losses and the status (divergences, bad draws) come back in one read each, for any pack size.
        assert counted["reads_per_read_back"] == 2


def test_the_counter_sees_the_reads_a_step_no_longer_makes() -> None:
    """Power: the reads the draws made before (a check of the draws with bool(), torch.multinomial of one
    draw per kmeans++ center) are counted, and sample_tasks, which raises at once, reads once."""
    g = torch.Generator().manual_seed(0)
    with count_host_reads() as reads:
        bool(torch.isfinite(torch.ones(3)).all())
        torch.multinomial(torch.rand(4, 5), 1, generator=g)
        torch.multinomial(torch.rand(4, 5), 9, replacement=True, generator=g)  # no read on CUDA either
    assert reads == {"__bool__": 1, "aten.multinomial": 1}
    with count_host_reads() as reads:
        sample_tasks(TaskSpec(n=32, d=2, k=4, init="kmeans++"), 3, g)
    assert sum(reads.values()) == 1


def test_non_finite_draws_raise_at_the_next_read_back() -> None:
    pack = pack_of(2, "kmeans++")
    spec = pack.trainers[1].spec
    pack.trainers[1].spec = replace(spec, scale=1e38)  # its next draws overflow float32
    pack.taken = pack.chunk  # the next step draws
    for _ in range(4):  # steps 11-14 (the first draws): not due, nothing read, nothing raised
        pack.step()
        assert not pack.due()
    pack.step()  # step 15: due
    assert pack.due()
    with pytest.raises(FloatingPointError, match="normal"):
        pack.read()
