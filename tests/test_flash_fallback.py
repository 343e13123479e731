"""The fused CPU dropout attention runs only where its private aten ops pass a self-check; else public SDPA.

The fallback is forced by making the private-op lookup fail, as on a torch build without them, or by a
kernel that computes something else; the path is decided afresh in each test and logged once.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import pytest
import torch
from support.configs import SHORT

from config.compose import compose
from models import attention, flash_dropout
from models.attention import DistanceAttention
from tracking.names import FINISHED
from tracking.recorder import MemoryRecorder
from training.loop import train

# model.dropout stays at the paper's 0.01: the path under test.
LOGGER = flash_dropout.__name__


@pytest.fixture
def undecided(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The path not yet chosen in this process; its log line captured."""
    monkeypatch.setattr(flash_dropout, "_usable", None)
    caplog.set_level(logging.INFO, logger=LOGGER)


@pytest.fixture
def no_private_ops(undecided: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """As on a torch build without the CPU flash ops; the fused path must then never run."""

    def missing() -> None:
        raise AttributeError(
            "'_OpNamespace' 'aten' object has no attribute '_scaled_dot_product_flash_attention_for_cpu'"
        )

    def fused(*args: object) -> None:
        raise AssertionError("the fused path ran without its private ops")

    monkeypatch.setattr(flash_dropout, "flash_ops", missing)
    monkeypatch.setattr(attention, "flash_dropout_attention", fused)


def lines(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    """What the path decision logged at `level`."""
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == level]


def dense_distance_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gamma: float, d_emb: int
) -> torch.Tensor:
    """The formula itself: softmax(-gamma ||q_i - k_j||^2 / sqrt(d_emb)) v."""
    return torch.softmax(-gamma * torch.cdist(q, k).pow(2) / math.sqrt(d_emb), -1) @ v


def test_this_torch_takes_the_fused_path_after_its_self_check(
    undecided: None, caplog: pytest.LogCaptureFixture
) -> None:
    generator_state = torch.get_rng_state()
    assert flash_dropout.flash_dropout_usable()
    assert torch.equal(
        torch.get_rng_state(), generator_state
    )  # the check leaves training's random draws alone
    assert flash_dropout.self_check_error() <= flash_dropout.SELF_CHECK_TOL
    (line,) = lines(caplog, logging.INFO)
    assert "fused CPU flash path" in line and "self-check" in line


def test_missing_private_ops_fall_back_to_public_sdpa(
    no_private_ops: None, caplog: pytest.LogCaptureFixture
) -> None:
    assert not flash_dropout.flash_dropout_usable()
    assert not flash_dropout.flash_dropout_usable()
    (line,) = lines(caplog, logging.WARNING)  # once per process, one line, with the path and the reason
    assert "scaled_dot_product_attention" in line and "AttributeError" in line and "\n" not in line
    torch.manual_seed(0)
    att = DistanceAttention(4, gamma=0.7, dropout=0.5)
    queries, keys = torch.randn(3, 9, 4), torch.randn(3, 11, 4)
    att.eval()  # dropout off: the fallback is the formula
    expected = dense_distance_attention(att.q(queries), att.k(keys), att.v(keys), 0.7, 4)
    torch.testing.assert_close(att(queries, keys), expected, rtol=1e-5, atol=1e-5)
    att.train()  # dropout on, through SDPA's own dropout_p
    dropped = att(queries, keys)
    assert torch.isfinite(dropped).all() and not torch.allclose(dropped, expected)
    dropped.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in att.parameters())


def test_a_kernel_that_fails_the_self_check_is_not_used(
    undecided: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    forward, backward = flash_dropout.flash_ops()

    def off_forward(*args: object, **kwargs: object) -> tuple[torch.Tensor, torch.Tensor]:
        out, lse = forward(*args, **kwargs)
        return out * 1.01, lse

    monkeypatch.setattr(flash_dropout, "flash_ops", lambda: (off_forward, backward))
    assert not flash_dropout.flash_dropout_usable()
    (line,) = lines(caplog, logging.WARNING)
    assert "scaled_dot_product_attention" in line and "self-check is off dense attention" in line


def test_training_on_the_fallback_runs_and_repeats(no_private_ops: None, tmp_path: Path) -> None:
    cfg = compose(SHORT)
    assert cfg.model.dropout > 0
    first = train(cfg, MemoryRecorder(), tmp_path / "a")
    again = train(cfg, MemoryRecorder(), tmp_path / "b")
    assert first.outcome == FINISHED and all(math.isfinite(v) for v in first.metrics.values())
    assert first.metrics == again.metrics  # the same config and seed, the same numbers
