#!/usr/bin/env bash
# Install what scripts/image/build.sh needs, from Debian: podman (with buildah's chroot isolation),
# debootstrap and Debian's archive keyring (debootstrap checks the Release signature with it).
# Root only: `make deps` runs this when it runs as root (as CI does).
#
#   scripts/image/install-tools.sh           # apt-get install podman debootstrap debian-archive-keyring
#
# Idempotent: when both are present nothing is done (milliseconds).
set -euo pipefail
SCRIPT_NAME=install-image-tools
# shellcheck source=scripts/e2e/_common.sh
. "$(dirname "$0")/../e2e/_common.sh"

PATH="${PATH}:/usr/sbin:/sbin"
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
have_both() {
    command -v podman >/dev/null 2>&1 && command -v debootstrap >/dev/null 2>&1 && [ -s "${KEYRING}" ]
}

if have_both; then
    say "$(podman --version), debootstrap $(dpkg-query -W -f='${Version}' debootstrap 2>/dev/null || echo '(not from dpkg)')"
    exit 0
fi

[ "$(id -u)" -eq 0 ] ||
    die "podman and debootstrap are missing and installing them needs root: run this script as root (Debian: apt-get install podman debootstrap)"
command -v apt-get >/dev/null 2>&1 ||
    die "podman/debootstrap are missing and apt-get is not available; install podman (with buildah) and debootstrap"

take_lock image-tools
say "step 1/2: apt-get update"
DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 update -qq >&2 ||
    die "apt-get update failed; the Debian mirror must be reachable"
say "step 2/2: apt-get install podman debootstrap debian-archive-keyring (about 30 packages, 27 MB)"
DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq \
    podman debootstrap debian-archive-keyring >&2 ||
    die "apt-get install podman debootstrap debian-archive-keyring failed; see apt's output above"
have_both || die "podman/debootstrap are installed but not on PATH (or ${KEYRING} is missing)"
say "done: $(podman --version)"
