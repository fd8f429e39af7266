#!/usr/bin/env bash
# Install checkov (PyPI, pinned) into its own cached virtual environment OUTSIDE the project, then
# print the path of its `checkov` command. tests/test_checkov.py runs it over every rendered shape
# of the Helm chart, the deployer recipes and the Dockerfile, offline (--skip-download).
#
#   scripts/e2e/install-checkov.sh          # -> ${VLLM_HEADROOM_CACHE:-~/.cache/vllm-headroom}/checkov-3.3.30/bin/checkov
#
# Not a dev extra of the project: checkov brings about 100 packages (290 MB), pins many of them
# exactly (boto3, jsonschema, packaging, ...) and would constrain or downgrade the project's own
# dependencies in .venv; in its own environment it changes nothing there.
#
# Idempotent: a complete environment (its stamp file matches the pin) is reused in well under a
# second; a partial one (interrupted install) is removed and rebuilt. About 40 s when fresh.
set -euo pipefail
SCRIPT_NAME=install-checkov
# shellcheck source=scripts/e2e/_common.sh
. "$(dirname "$0")/_common.sh"

CHECKOV_VERSION=3.3.30
VENV="${HEADROOM_CACHE}/checkov-${CHECKOV_VERSION}"
WANT="checkov==${CHECKOV_VERSION}"

reuse_venv_or_lock "checkov-${CHECKOV_VERSION}" "${VENV}" "${WANT}" bin/checkov "${VENV}/bin/checkov"

PY="${CHECKOV_PYTHON:-python3}"
command -v "${PY}" >/dev/null 2>&1 || die "${PY} not found; checkov needs Python 3.9 or later (set CHECKOV_PYTHON)"

say "step 1/3: creating ${VENV}"
fresh_venv "${PY}" "${VENV}"

say "step 2/3: pip install ${WANT} (about 100 packages)"
"${VENV}/bin/python" -m pip install --quiet --disable-pip-version-check "${WANT}" >&2 ||
    die "pip install ${WANT} failed (pip's output above says why); it needs PyPI"

say "step 3/3: checking that checkov runs"
got="$("${VENV}/bin/checkov" --version 2>&1 | tail -n 1)" || die "checkov does not run in ${VENV}: ${got}"
[ "${got}" = "${CHECKOV_VERSION}" ] || die "expected checkov ${CHECKOV_VERSION} in ${VENV}, found: ${got}"
stamp_venv "${VENV}" "${WANT}"
echo "${VENV}/bin/checkov"
