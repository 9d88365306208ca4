# The two commands: `make demo` runs the main job, `make test` runs the checks and tests.
# Both bootstrap what they need on a fresh machine (python3 + pip only).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-stress soak bench bench-quick lint typecheck clean redis-server browser

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev,bench,hermes,ops,browser]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/hermes-actors demo

lint: $(STAMP)
	$(BIN)/ruff check actors hermes_actors tests bench

typecheck: $(STAMP)
	$(BIN)/mypy actors hermes_actors bench

# The Redis transport tests need a real redis-server; installed when missing (they skip, saying why, if
# it cannot be installed, e.g. without root).
redis-server:
	@command -v redis-server >/dev/null 2>&1 || { \
	  echo "installing redis-server with apt-get (for the Redis transport tests)"; \
	  (DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null 2>&1 && \
	   DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null 2>&1) \
	  || echo "warning: could not install redis-server; the Redis tests will be skipped"; }

# The live page's browser test drives Debian's chromium through chromium-driver; installed when missing
# (tests/test_live_page.py skips, saying why, if they cannot be installed).
browser:
	@{ command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; } || { \
	  echo "installing chromium and chromium-driver with apt-get (for the live page's browser test)"; \
	  (DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null 2>&1 && \
	   DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null 2>&1) \
	  || echo "warning: could not install chromium/chromium-driver; the browser test will be skipped"; }

test: $(STAMP) redis-server browser lint typecheck
	$(BIN)/python -m pytest -q -m "not soak" -p no:cacheprovider

# `make test` RUNS times (default 5) on fresh clones of HEAD with two CPU-bound busy loops running; "N/N green".
RUNS ?= 5
test-stress:
	scripts/test-stress $(RUNS)

soak: $(STAMP)
	$(BIN)/python -m pytest -q -m soak -p no:cacheprovider

bench: $(STAMP)
	$(BIN)/hermes-actors bench

bench-quick: $(STAMP)
	$(BIN)/hermes-actors bench --quick

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
