# The two set-up commands of the README (`make demo`, `make test`) and their helpers.
# The project installs into ./.venv; only `deps` installs elsewhere: the e2e tests' vLLM venv, Helm
# and kubectl, checkov, and Debian's Prometheus, promtool and Alertmanager unpacked into the cache
# (any user), and, as root only, podman and debootstrap for the image test (scripts/ci-deps.sh).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint deps docs image

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

# The main job with no vLLM at hand: the sidecar against the built-in simulated vLLM, at 5x
# speed for one traffic cycle (short, chat, agents, burst, calm: 330 s simulated) and the next
# one's start. `vllm-headroom demo` alone runs until Ctrl-C.
demo: $(STAMP)
	$(BIN)/vllm-headroom demo --speed 5 --duration 75 --every 5

# Regenerate the rule files (alerts/vllm-headroom.rules.yml and the chart's copy with selector
# markers, from alerts/rules.py), the generated docs (docs/metrics.md, docs/configuration.md), the
# dashboards (dashboards/*.json, from dashboards/ and the rules) and the chart's copies of the
# dashboards (helm/vllm-headroom/files/: no link leaves the chart); tests fail when stale.
docs: $(STAMP)
	$(BIN)/python -m alerts.generate
	$(BIN)/python -c "from exporter.service.metricdefs import render_markdown; print(render_markdown(), end='')" > docs/metrics.md
	$(BIN)/python -c "from exporter.service.settings import render_configuration_markdown as r; print(r(), end='')" > docs/configuration.md
	$(BIN)/python -m dashboards.generate
	$(BIN)/python scripts/sync_chart_files.py

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# The e2e tests' vLLM, Prometheus, Alertmanager and Helm (cached outside the project; as root also
# podman and debootstrap; see scripts/ci-deps.sh).
deps:
	bash scripts/ci-deps.sh

# The tests find the cached tools themselves (tests/e2e/harness.py locators). Two phases, each
# test once: the unit tests in two processes, with the end-to-end tests' servers starting beside
# them, then the end-to-end bursts with the file-checking tests beside them, niced
# (scripts/test.sh says why).
test: $(STAMP) lint deps
	bash scripts/test.sh

# The image, with podman on a Debian base made by debootstrap (root; no registry needed). Prints its
# reference; docs/kubernetes.md says how to push and sign it.
image:
	bash scripts/image/build.sh
