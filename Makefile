# `make demo` and `make test` each create .venv when missing and install
# everything; run them on a fresh machine with nothing but Python 3.11.
PY      := .venv/bin/python
STAMP   := .venv/.installed

.PHONY: demo test test-fast install lock reproduce reproduce-d32 reproduce-plus reproduce-firm clean

# requirements.lock holds the exact version of every package the tests passed with (pyproject.toml
# keeps compatible ranges): installed as constraints, a fresh machine gets the same environment.
$(STAMP): pyproject.toml requirements.lock
	test -x $(PY) || python3 -m venv .venv
	$(PY) -m pip install -qq --upgrade pip
	# The CPU build of torch first, at the lock's version: an unpinned torch pulls a multi-GB CUDA build.
	$(PY) -m pip install -qq -c requirements.lock torch
	# cluster: Ray's dashboard, whose state API tests/test_sweep_cluster.py reads.
	$(PY) -m pip install -qq -c requirements.lock -e '.[dev,cluster]'
	touch $(STAMP)

install: $(STAMP)

# The paper's headline on a real slice of its grid (6 trials at tau 0.1 on a local Ray
# instance, MLflow in ./mlflow.db), then every figure and table it supports under reports/.
demo: $(STAMP)
	$(PY) -m sweeper.sweep sweep=demo
	$(PY) -m bench step_seconds sweep=demo --out reports/step_seconds.json
	$(PY) -m analysis.report select.sweep=demo eval.batches=1 eval.threads=2 'eval.lengths=[128,256,1024]'

# The paper's sub-grids at laptop scale (conf/sweep/lite.yaml): sweep, benchmark, report and
# claims into reports/leaner-clustering-lite/; budget: an hour on 2 cores (docs/reproduce.md).
LITE := tracking.experiment=leaner-clustering-lite
LITE_OUT := reports/leaner-clustering-lite
# How lite's trials are packed (cluster.pack): shapes, the models that share n, d, k, embedding and steps,
# up to cluster.pack_size in one trial, one trial per core: at lite's size a pack trains more model-steps per
# second than one model alone (`python -m bench pack --sizes laptop --threads 1`; docs/cluster.md, "The
# arithmetic"). LITE_PACK=none: one model a trial. Up to 12 models a pack, not the default 30: lite's two
# largest packs (21 and 24 models) then train as 12 + 9 and 12 + 12, 11 trials that share the two cores more
# evenly than 9 (the pack of 21 had taken most of a run on one core: docs/reproduce.md), and a pack of 12
# trains about as much per model as one of 21 (`python -m bench pack --sizes laptop --packs 9,12,21
# --regularizers l2,l2,l2,l2,l2,l2,ne loss.tau=0.1` times both).
LITE_PACK ?= shapes
# The sweep's own bookkeeping, off the two cores the trials need: a trial reports one evaluation round in
# five (250 steps; the driver writes each report into one MLflow run per model), and no Ray dashboard, which
# takes a share of a core while it runs. Together with the packs they brought `make reproduce` within its
# hour (docs/reproduce.md, the run before and after).
LITE_CLUSTER := cluster.pack=$(LITE_PACK) cluster.pack_size=12 cluster.report_every=5 cluster.dashboard_host=null
# The probes' default of 4 batches of 32 fresh tasks per condition and seed (128, as the report); both cores.
LITE_EVAL := speed_json=$(LITE_OUT)/speed_memory.json step_json=$(LITE_OUT)/step_seconds.json eval.threads=2
reproduce: $(STAMP)
	$(PY) -m sweeper.sweep sweep=lite $(LITE) $(LITE_CLUSTER)
	$(PY) -m bench speed_memory --quick --repeats 3 --out $(LITE_OUT)/speed_memory.json
	$(PY) -m bench step_seconds sweep=lite --repeats 3 --out $(LITE_OUT)/step_seconds.json
	$(PY) -m analysis.report select.sweep=lite $(LITE) $(LITE_EVAL)
	$(PY) -m analysis.claims select.sweep=lite $(LITE) $(LITE_EVAL)
	$(BOTH_CLAIMS) $(LITE_EVAL) || test $$? -eq 7

# The paper's d 32 claims (conf/sweep/lite32.yaml: clusters, lr and family at d 32, 10,000 steps, 3 seeds,
# trained at n 128 for k 10 and n 256 for k 25): its own experiment and reports/leaner-clustering-lite32/;
# budget: about 4 hours on 2 cores. Packs of 9 (cluster.pack=shapes): its 54 models train as 6 packs of
# 9, two long k 25 packs beside four short k 10 ones, so both cores end together (conf/sweep/lite32.yaml's
# "Cost").
# Stopped midway, the same command resumes it (checkpoints: Ray's storage; store: tracking.uri).
LITE32 := tracking.experiment=leaner-clustering-lite32
LITE32_OUT := reports/leaner-clustering-lite32
LITE32_CLUSTER := cluster.pack=shapes cluster.pack_size=9 cluster.report_every=5 cluster.dashboard_host=null
LITE32_EVAL := speed_json=$(LITE32_OUT)/speed_memory.json step_json=$(LITE32_OUT)/step_seconds.json eval.threads=2
reproduce-d32: $(STAMP)
	$(PY) -m sweeper.sweep sweep=lite32 $(LITE32) $(LITE32_CLUSTER)
	$(PY) -m bench speed_memory --quick --repeats 3 --out $(LITE32_OUT)/speed_memory.json
	$(PY) -m bench step_seconds sweep=lite32 --repeats 3 --out $(LITE32_OUT)/step_seconds.json
	$(PY) -m analysis.report select.sweep=lite32 $(LITE32) $(LITE32_EVAL)
	$(PY) -m analysis.claims select.sweep=lite32 $(LITE32) $(LITE32_EVAL)
	$(BOTH_CLAIMS) $(LITE32_EVAL) || test $$? -eq 7

# The declared extension (conf/sweep/lite-plus.yaml, docs/science.md section 7.3: the claims' scope that lite
# and lite32 leave untrained, fixed before it ran): 180 models, 1.8 million model-steps, about 6 to 9 hours of
# both cores, so one allocation a call: the sweep for PLUS_BUDGET_S seconds (it exits 75 when the budget ends
# it), the claims on its runs alone, which log every evaluation of its ended models into its store, and a lean
# archive (sweeper.archive --lean: the store as SQL text and what unfinished runs resume from) to commit. The
# next call, with the archive unpacked into the clone's root (`python -m sweeper.unpack
# docs/results/plus/run.tar .`), goes on (docs/results/plus/README.md says from which commit). The run ended
# on 2026-12-08; its last archive is in the history (`git show b48082e:docs/results/plus/run.tar`). PLUS_DRAIN_S,
# when set, is the budget's drain (cluster.drain_s): no pack starts in its last that many seconds, so the
# allocation ends where its packs end and its archive carries no checkpoint. Its home folder: PLUS_HOME.
PLUS_HOME ?= plus
PLUS := tracking.experiment=leaner-clustering-lite-plus tracking.uri=sqlite:///$(abspath $(PLUS_HOME))/mlflow.db
PLUS_BUDGET_S ?= 7200
PLUS_DRAIN_S ?=
PLUS_DRAIN := $(if $(PLUS_DRAIN_S),cluster.drain_s=$(PLUS_DRAIN_S))
PLUS_CLUSTER := cluster.pack=shapes cluster.pack_size=9 cluster.report_every=5 cluster.dashboard_host=null
reproduce-plus: $(STAMP)
	mkdir -p $(PLUS_HOME) docs/results/plus
	$(PY) -m sweeper.sweep sweep=lite-plus $(PLUS) $(PLUS_CLUSTER) cluster.time_budget_s=$(PLUS_BUDGET_S) $(PLUS_DRAIN) || test $$? -eq 75
	$(PY) -m analysis.claims select.sweep=lite-plus $(PLUS) eval.threads=2
	$(PY) -m sweeper.archive $(PLUS_HOME) --lean --out docs/results/plus/run.tar

# Seeds where a verdict of `make reproduce` is marginal (docs/science.md section 7.2, docs/reproduce.md):
# rounds of `analysis.seeds`, which judges the claims on lite's runs and its rounds' and writes the next round
# (FIRM_DIR/sweep/lite-seeds.yaml: the configurations behind marginal cases, the paper's next seeds), and the
# ordinary sweep that trains it, into lite's store and experiment, until every case is firm, more of the
# paper's ten seeds could settle none, or FIRM_BUDGET_S seconds of training at lite's recorded rate (its
# parent run's model_steps_per_s) are spent: an hour of both cores. The rounds' claims reevaluate the probes
# on the new models, outside that budget. Stopped midway, the same target resumes (the round's file stays
# until its models have ended). Its record, firmness.md (every case that was marginal, before and after) and
# the rounds, goes to FIRM_RESULTS. The FIRM_* variables point it at another sweep, experiment or folder.
FIRM_SWEEP ?= lite
FIRM_EXPERIMENT ?= leaner-clustering-lite
FIRM_BUDGET_S ?= 3600
FIRM_DIR ?= reports/firm-sweeps
FIRM_RESULTS ?= docs/results/seeds
FIRM_OUT := reports/$(FIRM_EXPERIMENT)/seeds
FIRM_WHERE := tracking.experiment=$(FIRM_EXPERIMENT)
FIRM_EVAL := speed_json=reports/$(FIRM_EXPERIMENT)/speed_memory.json step_json=reports/$(FIRM_EXPERIMENT)/step_seconds.json eval.threads=2
reproduce-firm: $(STAMP)
	mkdir -p $(FIRM_DIR)/sweep $(FIRM_RESULTS)
	set -e; while :; do \
	  $(PY) -m analysis.seeds seeds.sweep=$(FIRM_SWEEP) seeds.budget_s=$(FIRM_BUDGET_S) seeds.config_dir=$(FIRM_DIR) $(FIRM_WHERE) $(FIRM_EVAL); \
	  test -f $(FIRM_DIR)/sweep/$(FIRM_SWEEP)-seeds.yaml || break; \
	  $(PY) -m sweeper.sweep --config-dir $(FIRM_DIR) sweep=$(FIRM_SWEEP)-seeds $(FIRM_WHERE) $(LITE_CLUSTER); \
	done
	cp $(FIRM_OUT)/*.md $(FIRM_OUT)/*.csv $(FIRM_RESULTS)/

# Each of the two ends with the claims on both experiments' runs as one table, in
# reports/leaner-clustering-lite+leaner-clustering-lite32/, once ./mlflow.db holds both: large_lr_worse has its
# d 4 half in lite and its d 32 half in lite32, so only that table judges it whole. Until the other target has
# run, the command names the experiment that has no runs and exits 7 (no runs), which ends the target
# without failing it; any other error fails it.
BOTH_CLAIMS := $(PY) -m analysis.claims experiments=[leaner-clustering-lite,leaner-clustering-lite32]

# House style first (pyproject.toml's [tool.ruff]), then the suite on two pytest workers, a file's tests on
# one, the files with the most slow tests first (tests/conftest.py). Not --dist loadgroup: pytest-xdist
# 3.8 marks a group in item._nodeid, which pytest 9.2 no longer reads, so every test became its own group.
test: $(STAMP)
	$(PY) -m ruff format --check .
	$(PY) -m ruff check .
	# The project's bytecode once (every .py outside hidden folders such as .venv): where
	# PYTHONDONTWRITEBYTECODE is set, as on these machines, each of the few hundred processes the suite
	# starts (drivers, Ray workers, CLIs) would otherwise compile the project from source again.
	$(PY) -m compileall -q -x '/\.' .
	$(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder

# Unit and config tests only: no Ray, no servers, no sweep or training subprocesses; on two pytest workers as
# `make test` (the same CPU-seconds, about half the wall time on 2 cores).
test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow" -n 2 --dist loadfile --no-loadscope-reorder

# After changing pyproject.toml's dependencies: install, run `make test`, then record the versions.
lock: $(STAMP)
	{ echo "# pip constraints: the exact versions \`make test\` passed with (\`make lock\` rewrites this file)."; \
	  $(PY) -m pip freeze --exclude-editable | sed 's/+cpu$$//'; } > requirements.lock

clean:
	rm -rf .venv
