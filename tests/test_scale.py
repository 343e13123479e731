"""The scale probe (python -m sweeper.scale_probe, a fresh process per measurement) end to end at 12 trials
and 2 packs of ten: the sweep's production wiring (its record, the Tuner) and `mlflow server` on SQLite;
every model stored once with every point.
The 3,000-trial run is a benchmark (docs/cluster.md, "The driver at 3,000 trials"), not a test."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support.repo import REPO

from sweeper.scale.probe import INTERVALS, interval_points

pytestmark = pytest.mark.slow


def test_tiny_scale_probe_stores_every_model_once_and_prints_the_table() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "sweeper.scale_probe",
            "--trials",
            "12",
            "--packs",
            "20",
            "--store",
            "sqlite",
            "--workers",
            "1",  # MLflow's default 4 cost the suite a minute of CPU starting and idling
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "database is locked" not in done.stdout + done.stderr  # SQLite behind the server, trials at once
    lines = done.stdout.splitlines()
    rows = [json.loads(line) for line in lines if line.startswith("{")]
    assert [(r["models"], r["trials"], r["pack"]) for r in rows] == [(12, 12, "none"), (20, 2, "seeds")]
    per_model = INTERVALS * len(interval_points(50))
    for r in rows:
        assert r["exit_code"] == 0 and r["runs_stored"] == r["models"] and r["lost"] == 0
        assert r["points_written"] == r["models"] * per_model  # none dropped, none twice
        assert r["cpu_s_per_trial"] > 0 and r["driver_rss_peak_mib"] >= r["driver_rss_start_mib"] > 0
    assert lines[-1] == "tracking server on sqlite" and lines[-2].split()[:3] == ["20", "2", "seeds"]
