# Two commands: `make demo` (set up + run the main job) and `make test` (set up + run all tests).
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup demo test test-fast bench clean

setup:
	bash scripts/setup.sh

demo: setup
	bash scripts/demo.sh

test: setup
	$(PY) -m pytest -n 2 --dist loadgroup --no-loadscope-reorder

clean:
	rm -rf runs examples/arith/artifacts examples/moe/artifacts examples/tools/artifacts
