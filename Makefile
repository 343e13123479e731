# `make demo` and `make test` each create .venv when missing and install
# everything; run them on a fresh machine with nothing but Python 3.11.
PY      := .venv/bin/python
STAMP   := .venv/.installed

.PHONY: demo test install clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip
	# The CPU build of torch, pinned: an unpinned torch pulls a multi-GB CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# A real slice of the paper grid (12 trials on a local Ray instance, MLflow in
# ./mlflow.db), then every figure and table it supports under reports/.
demo: $(STAMP)
	$(PY) -m sweeper.sweep sweep=demo
	$(PY) -m analysis.report select.sweep=demo eval.batches=1 'eval.lengths=[128,256,1024]'

test: $(STAMP)
	$(PY) -m pytest -q

clean:
	rm -rf .venv
