"""The sweep driver: what `python -m sweeper.sweep` runs, its timeline (timeline.py) and every step of it,
down to the trial a Ray worker runs (trial.py)."""
