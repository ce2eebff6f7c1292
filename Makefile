# The two commands of the README: `make demo` and `make test`. Both set up .venv first.
# `make test-fast` is the quick loop of docs/development.md (its tiers table).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp

.PHONY: setup promtool chromium demo test test-fast lint fmt bench bench-raft bench-broker bench-topics bench-http bench-delay bench-tx bench-grpc bench-spark bench-failover bench-peers clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,spark]'
	$(PY) tools/protos.py
	@touch $(STAMP)

# The gRPC front's generated modules (gitignored): made again when removed or outdated.
PROTOCOL := api/rocketmq/protocol/SOURCE
$(PROTOCOL): tools/protos.py $(STAMP)
	$(PY) tools/protos.py

setup: $(STAMP) $(PROTOCOL)

# promtool, Prometheus's rule checker (tests/docs/test_alert_rules.py runs the alert rules'
# unit tests with it), taken out of Debian's prometheus package without installing it
# (that pulls 37 packages and starts services): only usr/bin/promtool, gitignored. A fresh
# machine's apt has no package lists yet: `apt-get update` then, only if the download fails.
PROMTOOL := .tools/promtool
$(PROMTOOL):
	@mkdir -p $(@D)
	@set -e; tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; chmod 755 "$$tmp"; \
	( cd "$$tmp" && { apt-get download prometheus || { apt-get update && apt-get download prometheus; }; } ); \
	dpkg-deb -x "$$tmp"/prometheus_*.deb "$$tmp/root"; \
	cp "$$tmp/root/usr/bin/promtool" $@.part; mv $@.part $@
	$@ --version

promtool: $(PROMTOOL)

# Debian's chromium, headless, for the web console's tests (tests/process/test_console.py
# drives it over the DevTools protocol: no chromedriver, no browser download) and for
# `python -m tools.screenshots`. Installed with apt-get only when missing (root, as in CI);
# a fresh machine's apt has no package lists yet: `apt-get update` then, only if needed.
CHROMIUM := /usr/bin/chromium
$(CHROMIUM):
	apt-get install -y --no-install-recommends chromium \
	|| { apt-get update && apt-get install -y --no-install-recommends chromium; }
	$@ --version

chromium: $(CHROMIUM)

demo: setup
	$(VENV)/bin/ledgermq demo

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

test: setup lint $(PROMTOOL) $(CHROMIUM)
	$(PY) -m pytest

# The tiers that need no node process, no JVM and no root (tests/tiers.py FAST), in
# FAST_WORKERS processes: their tests mostly wait on timers, so more workers than cores pay.
FAST_WORKERS ?= 4
test-fast: setup $(PROMTOOL)
	$(PY) -m pytest -q -m "unit or docs" -n $(FAST_WORKERS)

fmt: setup
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

bench: setup
	$(PY) bench/store_bench.py

bench-raft: setup
	$(PY) -m pip install --quiet -e '.[bench]'
	$(PY) bench/raft_bench.py

bench-broker: setup
	$(PY) bench/broker_bench.py

bench-topics: setup  # issue 31: produce and the cost of a topic at 1, 100 and 1,000 topics x 8 queues (~3 min)
	$(PY) bench/topics_bench.py

bench-http: setup
	$(PY) bench/http_bench.py

bench-delay: setup  # issue 29: delayed produce next to plain, release of 100,000 due at once
	$(PY) bench/delay_bench.py

bench-tx: setup  # issue 29: transactional produce + commit next to plain, b=1, 10, 100 (~1 min)
	$(PY) bench/tx_bench.py

bench-grpc: setup  # issue 30: the official Python producer (sync, async) and push consumer over gRPC next to HTTP (~1.5 min)
	$(PY) bench/grpc_bench.py

bench-failover: setup  # issue 18: kill -9 / SIGSTOP of the master, and no fault (~10 min)
	$(PY) bench/failover_bench.py --mode kill --kills 20
	$(PY) bench/failover_bench.py --mode stop --kills 20
	$(PY) bench/failover_bench.py --mode none --duration 180

bench-spark: setup
	$(PY) bench/spark_bench.py

# LedgerMQ next to NATS JetStream, etcd, pysyncobj and the HTTP floor (issue 15): installs
# the `bench` extra here, and nats-server / etcd-server with apt-get if they are missing.
# ARGS=--quick: a smoke run of a few minutes; ARGS=--help: every option.
bench-peers: setup
	$(PY) -m pip install --quiet -e '.[bench]'
	$(PY) bench/peers_bench.py $(ARGS)

clean:
	rm -rf $(VENV) .tools .pytest_cache .mypy_cache .ruff_cache .hypothesis
