#!/usr/bin/env bash
# Unpack Prometheus and promtool from Debian's `prometheus` package into the cache, then print the
# directory that holds both (the tests look there first, then on PATH: tests/e2e/harness.py).
#
#   scripts/e2e/install-prometheus.sh        # -> ${VLLM_HEADROOM_CACHE:-~/.cache/vllm-headroom}/prometheus/bin
#
# As root or as any user: `apt-get download` with private package lists + `dpkg -x` (scripts/e2e/
# _debs.sh); nothing is installed system-wide and no service is started. The binaries need only
# libc; the tests use the HTTP API, so the web UI's JavaScript packages are not needed.
# Idempotent: a complete unpacked tree is reused at once (a few milliseconds). Prometheus 2.x only
# (the harness uses its flags); Debian's current candidate is taken, whatever its revision.
set -euo pipefail
SCRIPT_NAME=install-prometheus
# shellcheck source=scripts/e2e/_common.sh
. "$(dirname "$0")/_common.sh"
# shellcheck source=scripts/e2e/_debs.sh
. "$(dirname "$0")/_debs.sh"

DEST="${HEADROOM_CACHE}/prometheus"
BIN="${DEST}/bin"
LAYOUT="prometheus+promtool from Debian, layout 1"

installed() {
    [ -x "${BIN}/prometheus" ] && [ -x "${BIN}/promtool" ] &&
        [ "$(cat "${DEST}/.headroom-installed" 2>/dev/null)" = "${LAYOUT}" ]
}

if installed; then
    say "$(cat "${DEST}/versions") already unpacked"
    echo "${BIN}"
    exit 0
fi

take_lock debian-packages
if installed; then
    echo "${BIN}"
    exit 0
fi

staging="$(mktemp -d "${HEADROOM_CACHE}/.prometheus.XXXXXX")"
chmod 0755 "${staging}"
trap 'rm -rf "${staging}"' EXIT

say "step 1/2: fetching and unpacking Debian's prometheus package (about 19 MB)"
debian_unpack "${staging}" prometheus

say "step 2/2: checking the binaries"
mkdir -p "${staging}/bin"
ln -s ../root/usr/bin/prometheus "${staging}/bin/prometheus"
ln -s ../root/usr/bin/promtool "${staging}/bin/promtool"
version="$("${staging}/bin/prometheus" --version 2>&1 | head -n 1)" ||
    die "the unpacked prometheus does not run on this machine: ${version}"
case "${version}" in
"prometheus, version 2."*) ;;
*) die "expected Prometheus 2.x from Debian, got: ${version}; the tests use Prometheus 2 flags" ;;
esac
"${staging}/bin/promtool" --version >/dev/null 2>&1 || die "the unpacked promtool does not run on this machine"
echo "${LAYOUT}" >"${staging}/.headroom-installed"

debian_publish "${staging}" "${DEST}"
trap - EXIT
say "done: ${version} in ${BIN}"
echo "${BIN}"
