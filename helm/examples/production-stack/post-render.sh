#!/bin/sh
# Helm post-renderer: adds the vllm-headroom sidecar to production-stack's vLLM engine
# Deployment, so that the Deployment Helm applies (and re-applies on every upgrade) has it.
#   helm upgrade --install vllm vllm/vllm-stack -f values.yaml --post-renderer ./post-render.sh
# Needs kubectl (its built-in kustomize; KUBECTL names another binary). kustomization.yaml and
# vllm-headroom-patch.yaml are read from this script's directory.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat >"$work/rendered.yaml"
cp "$here/kustomization.yaml" "$here/vllm-headroom-patch.yaml" "$work/"
"${KUBECTL:-kubectl}" kustomize "$work"
