#!/usr/bin/env bash
# Build the project's Dockerfile into a local image with podman, with no registry needed, then
# print the image's reference. Root only (debootstrap, podman's storage); tests/e2e/test_image.py
# runs it.
#
#   scripts/image/build.sh                   # -> localhost/vllm-headroom:inputs-<hash>, also :<version>
#
# 1. The base: the Dockerfile's default base is python:3.11-slim-<release>; with no registry we make
#    the same Debian release with debootstrap (minbase + python3, pip, python-is-python3 for the
#    HEALTHCHECK, ca-certificates), cached as a tarball under the cache and imported as
#    localhost/vllm-headroom-base:debian-<release>. Debian marks its Python EXTERNALLY-MANAGED
#    (PEP 668), which would make the Dockerfile's `pip install` fail: the base drops that marker, as
#    the python:*-slim images (whose Python is not Debian's) do not have it either.
# 2. The build: `podman build --isolation chroot` (RUN steps in a chroot on the host's network: no
#    OCI runtime, no network namespace), `--format docker` (OCI format drops the HEALTHCHECK),
#    `--pull=never`. Cached: when the image for the same inputs (Dockerfile, .dockerignore, the
#    files .dockerignore lets in, this script, the base, the build args) exists, nothing is built.
#
# Environment (all optional):
#   HEADROOM_IMAGE          repository to tag                  (default localhost/vllm-headroom)
#   HEADROOM_BASE_IMAGE     a base to use instead of debootstrap's, e.g. a mirror's
#                           python:3.11-slim-bookworm@sha256:...  (then pulled if missing)
#   HEADROOM_DEBIAN_MIRROR  debootstrap's mirror                (default http://deb.debian.org/debian)
#   HEADROOM_BUILD_CA       CA bundle that pip inside the build trusts, given to the build as the
#                           secret `ca` (never a layer). Default: $PIP_CERT, else $SSL_CERT_FILE,
#                           else /etc/ssl/certs/ca-certificates.crt; `none` for pip's own.
#   PIP_INDEX_URL, PIP_EXTRA_INDEX_URL, PIP_TRUSTED_HOST
#                           forwarded to the build stage as build args when set (a PyPI mirror)
set -euo pipefail
SCRIPT_NAME=build-image
# shellcheck source=scripts/e2e/_common.sh
. "$(dirname "$0")/../e2e/_common.sh"
cd "$(dirname "$0")/../.."
PATH="${PATH}:/usr/sbin:/sbin"

[ "$(id -u)" -eq 0 ] || die "needs root (debootstrap, podman); run it as root"
scripts/image/install-tools.sh

REPOSITORY="${HEADROOM_IMAGE:-localhost/vllm-headroom}"
MIRROR="${HEADROOM_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
VERSION="$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' exporter/__init__.py)"
[ -n "${VERSION}" ] || die "no __version__ in exporter/__init__.py"
# The release of the Dockerfile's default base: ARG PYTHON_IMAGE=python:3.11-slim-bookworm.
RELEASE="$(sed -n 's/^ARG PYTHON_IMAGE=python:[0-9.]*-slim-\([a-z]*\).*$/\1/p' Dockerfile)"
[ -n "${RELEASE}" ] || die "cannot read the Debian release from the Dockerfile's ARG PYTHON_IMAGE=python:X.Y-slim-<release>"
IMAGE_CACHE="${HEADROOM_CACHE}/image"
BASE_TARBALL="${IMAGE_CACHE}/debian-${RELEASE}-python3.tar.gz"

ca="${HEADROOM_BUILD_CA:-${PIP_CERT:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}}"
if [ "${ca}" = none ] || [ ! -s "${ca}" ]; then
    [ "${ca}" = none ] || [ -z "${HEADROOM_BUILD_CA:-}" ] || die "HEADROOM_BUILD_CA=${ca} is not a file"
    ca=""
fi

take_lock image

rootfs=""
cleanup() {
    if [ -n "${rootfs}" ] && [ -d "${rootfs}" ]; then
        # debootstrap mounts /proc and /sys (maybe /dev) inside; never delete through a mount.
        findmnt --list --noheadings --output TARGET | { grep -F "${rootfs}/" || true; } | sort -r |
            while read -r mountpoint; do umount -l "${mountpoint}" || true; done
        rm -rf --one-file-system "${rootfs}"
    fi
    rm -f "${BASE_TARBALL}.tmp"
}
trap cleanup EXIT

make_base_tarball() {
    rootfs="${IMAGE_CACHE}/rootfs-${RELEASE}.tmp"
    cleanup
    mkdir -p "${IMAGE_CACHE}"
    say "base 1/2: debootstrap ${RELEASE} from ${MIRROR} (minbase + python3: 47 MB, about a minute)"
    debootstrap --variant=minbase --keyring=/usr/share/keyrings/debian-archive-keyring.gpg \
        --include=python3,python3-pip,python-is-python3,ca-certificates \
        "${RELEASE}" "${rootfs}" "${MIRROR}" >"${IMAGE_CACHE}/debootstrap.log" 2>&1 ||
        die "debootstrap ${RELEASE} failed (${IMAGE_CACHE}/debootstrap.log: $(tail -n 1 "${IMAGE_CACHE}/debootstrap.log"))"
    rm -f "${rootfs}"/usr/lib/python3*/EXTERNALLY-MANAGED
    # What the image must not inherit from this machine or the bootstrap: DNS and host name (the
    # runtime provides them), package lists and downloaded .debs.
    rm -f "${rootfs}/etc/resolv.conf" "${rootfs}/etc/hostname"
    rm -rf "${rootfs}"/var/lib/apt/lists/* "${rootfs}"/var/cache/apt/archives/*.deb "${rootfs}"/var/log/*
    say "base 2/2: packing ${BASE_TARBALL}"
    tar --numeric-owner --one-file-system -C "${rootfs}" -cf - . | gzip -1 >"${BASE_TARBALL}.tmp"
    mv -f "${BASE_TARBALL}.tmp" "${BASE_TARBALL}"
    cleanup
    rootfs=""
}

if [ -n "${HEADROOM_BASE_IMAGE:-}" ]; then
    base="${HEADROOM_BASE_IMAGE}"
    podman image exists "${base}" || podman pull "${base}" >&2 || die "cannot pull ${base}"
else
    base="localhost/vllm-headroom-base:debian-${RELEASE}"
    if ! podman image exists "${base}" || [ ! -s "${BASE_TARBALL}" ]; then
        [ -s "${BASE_TARBALL}" ] || make_base_tarball
        say "importing ${BASE_TARBALL} as ${base}"
        old_base="$(podman image inspect --format '{{.Id}}' "${base}" 2>/dev/null || true)"
        gunzip -c "${BASE_TARBALL}" | podman import \
            --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
            --change 'ENV LANG=C.UTF-8' \
            --change 'CMD ["python3"]' - "${base}" >/dev/null ||
            die "podman import of ${BASE_TARBALL} failed"
        if [ -n "${old_base}" ]; then
            podman rmi "${old_base}" >/dev/null 2>&1 || true # the base it replaces, unless in use
        fi
    fi
fi
base_id="$(podman image inspect --format '{{.Id}}' "${base}")"

build_args=(--build-arg "PYTHON_IMAGE=${base}" --build-arg "VERSION=${VERSION}")
for name in PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_TRUSTED_HOST; do
    if [ -n "${!name:-}" ]; then
        build_args+=(--build-arg "${name}=${!name}")
    fi
done

# The files the build context holds: the `!` entries of .dockerignore, less its caches.
context_files() {
    local entry
    sed -n 's/^!\(.*\)$/\1/p' .dockerignore | while read -r entry; do
        find "${entry%/}" -type f ! -name '*.pyc' ! -path '*/__pycache__/*' -print0
    done | sort -z
}
inputs="$(
    {
        printf '%s\n' "base ${base_id}" "${build_args[@]}"
        sha256sum Dockerfile .dockerignore scripts/image/build.sh
        context_files | xargs -0 sha256sum
    } | sha256sum | cut -c1-16
)"
ref="${REPOSITORY}:inputs-${inputs}"

if podman image exists "${ref}"; then
    say "${ref} is up to date"
    echo "${ref}"
    exit 0
fi

secret=()
if [ -n "${ca}" ]; then
    secret=(--secret "id=ca,src=${ca}")
fi
say "building ${ref} on ${base}${ca:+ (CA bundle ${ca})}"
podman build --isolation chroot --format docker --pull=never --layers=false \
    "${build_args[@]}" "${secret[@]}" --tag "${ref}" --tag "${REPOSITORY}:${VERSION}" . >&2 ||
    die "podman build failed (its output above)"

# Older builds of this repository: untag them (their layers go when no tag is left).
podman images --format '{{.Repository}}:{{.Tag}}' "${REPOSITORY}" |
    { grep -F "${REPOSITORY}:inputs-" | grep -vxF "${ref}" || true; } |
    while read -r old; do podman rmi "${old}" >/dev/null 2>&1 || true; done
say "done: ${ref} ($(podman image inspect --format '{{.Size}}' "${ref}") bytes)"
echo "${ref}"
