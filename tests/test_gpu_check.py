"""The one-shot GPU check (python -m bench gpu) runs end to end at toy sizes on the CPU.

On a GPU node the same command, without --tiny, is what a session with a device runs
(docs/cluster.md, "A one-shot check of a GPU node"); here it proves every check runs and that the
equality checks hold where they can be computed: on the CPU.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import gpu


@pytest.mark.slow
def test_tiny_gpu_check_on_cpu_passes_and_writes_every_figure(tmp_path: Path, capsys) -> None:
    out = tmp_path / "gpu.json"
    assert gpu.main(["--tiny", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["device"] == "cpu" and report["tiny"] is True
    for key in gpu.EQUALITY_CHECKS:
        assert report[key]["ok"] is True, report[key]
    assert report["exact"]["max_relative_error"] <= gpu.TOLERANCE
    # A small n and a larger one (the paper's 512 on a GPU), each crashed, resumed and bit-equal.
    assert [(r["n"], r["crashed_and_resumed"], r["bit_equal"]) for r in report["resume"]["runs"]] == [
        (16, True, True),
        (32, True, True),
    ]
    assert report["resume"]["deterministic_off_n32_bit_equal"] is True  # a CPU is deterministic either way
    # Packs of 1 and 3: two chunks of steps, the first of each drawing, no host read in any step; the CUDA
    # sync count is CUDA's alone.
    syncs = report["syncs"]
    assert [(r["pack"], r["steps"], r["draw_steps"], r["reads_in_steps"]) for r in syncs["rows"]] == [
        (1, 20, 2, 0),
        (3, 20, 2, 0),
    ]
    assert all(r["reads_per_read_back"] == 2 and r["cuda_syncs_in_steps"] is None for r in syncs["rows"])
    assert syncs["sync_debug_mode"].startswith("CUDA only")
    # The memory cap is CUDA's: on a CPU the check says it is skipped, and sets no exit code.
    assert report["memory_cap"] == {
        "ok": None,
        "skipped": "a trial caps CUDA memory only, and the device is cpu",
    }
    assert {(r["n"], r["d"], r["k"], r["embedding"]) for r in report["steps"]} == {
        (16, 4, 6, "onehot"),
        (16, 4, 6, "binary"),
    }
    for row in report["steps"]:
        assert row["solo"]["seconds_per_step"] > 0 and [p["pack"] for p in row["packs"]] == [1, 2]
        assert all(p["model_steps_per_second"] > 0 and p["flop_rate"] > 0 for p in row["packs"])
        assert [c["pack"] for c in row["op_calls"]] == [1, 2]
        assert all(type(c["aten_ops"]) is int and c["aten_ops"] > 0 for c in row["op_calls"])
    assert report["compile"]["mode"] == "aot_eager" and report["compile"]["speedup"] > 0
    assert (
        report["projection"]["projected_hours_solo"] > 0
        and report["projection"]["projected_hours_packed"] > 0
    )
    printed = capsys.readouterr().out
    assert "exact      PASS" in printed and "projection" in printed.splitlines()[-1]
    assert "resume     PASS  n=16: crashed_and_resumed=True bit_equal=True; n=32:" in printed
    assert "syncs      PASS  P 1: 0 host reads in 20 steps (2 drawing), 2 per read-back; P 3:" in printed
    assert "per pack step P 1:" in printed
    assert "memory_cap SKIP  skipped=a trial caps CUDA memory only, and the device is cpu" in printed


def test_an_equality_check_outside_its_tolerance_is_not_ok(monkeypatch) -> None:
    monkeypatch.setattr(gpu, "TOLERANCE", -1.0)  # no error can be <= -1: the exact check must fail
    result = gpu.check_exact(gpu.pick_device("cpu"), gpu.exact_tasks(tiny=True))
    assert result["ok"] is False and result["max_relative_error"] >= 0 and result["tolerance"] == -1.0
