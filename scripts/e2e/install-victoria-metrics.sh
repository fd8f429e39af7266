#!/usr/bin/env bash
# Unpack VictoriaMetrics, vmagent and vmalert from Debian's `victoria-metrics` package into the
# cache, then print the directory that holds the three (tests/e2e/harness.py looks there first).
#
#   scripts/e2e/install-victoria-metrics.sh  # -> ${VLLM_HEADROOM_CACHE:-~/.cache/vllm-headroom}/victoria-metrics/bin
#
# For the sharding e2e (tests/e2e/test_sharding_e2e.py): scrape shards remote-write into one
# VictoriaMetrics and vmalert evaluates the shipped rules on it (docs/kubernetes.md, "Past one
# machine"). As root or as any user, like install-prometheus.sh (apt-get download + dpkg -x,
# scripts/e2e/_debs.sh); nothing is installed system-wide and no service is started. The binaries
# need libc and libzstd (Debian's apt depends on libzstd too, so it is there). Debian's build
# prints an empty -version: the package's version is in versions. The install ends by starting
# VictoriaMetrics once on loopback until /health answers, and checks that vmagent and vmalert run.
# Idempotent: a complete unpacked tree is reused at once.
set -euo pipefail
SCRIPT_NAME=install-victoria-metrics
# shellcheck source=scripts/e2e/_common.sh
. "$(dirname "$0")/_common.sh"
# shellcheck source=scripts/e2e/_debs.sh
. "$(dirname "$0")/_debs.sh"

DEST="${HEADROOM_CACHE}/victoria-metrics"
BIN="${DEST}/bin"
LAYOUT="victoria-metrics+vmagent+vmalert from Debian, layout 1"
TOOLS=(victoria-metrics vmagent vmalert)

installed() {
    local tool
    for tool in "${TOOLS[@]}"; do
        [ -x "${BIN}/${tool}" ] || return 1
    done
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

command -v python3 >/dev/null 2>&1 || die "python3 not found; it picks a free port for the smoke start"

staging="$(mktemp -d "${HEADROOM_CACHE}/.victoria-metrics.XXXXXX")"
chmod 0755 "${staging}"
vm_pid=""
cleanup() {
    if [ -n "${vm_pid}" ]; then
        kill "${vm_pid}" 2>/dev/null || true
    fi
    rm -rf "${staging}"
}
trap cleanup EXIT

say "step 1/3: fetching and unpacking Debian's victoria-metrics package (about 23 MB)"
debian_unpack "${staging}" victoria-metrics

say "step 2/3: checking the binaries"
mkdir -p "${staging}/bin"
for tool in "${TOOLS[@]}"; do
    [ -x "${staging}/root/usr/bin/${tool}" ] ||
        die "the package has no /usr/bin/${tool}; Debian changed its layout, update install-victoria-metrics.sh"
    ln -s "../root/usr/bin/${tool}" "${staging}/bin/${tool}"
    out="$("${staging}/bin/${tool}" -version 2>&1)" ||
        die "the unpacked ${tool} does not run on this machine: $(echo "${out}" | tail -n 1)"
done

say "step 3/3: starting VictoriaMetrics once (127.0.0.1)"
work="${staging}/check"
mkdir -p "${work}"
port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
"${staging}/bin/victoria-metrics" -httpListenAddr="127.0.0.1:${port}" -storageDataPath="${work}/data" \
    >"${work}/log" 2>&1 &
vm_pid=$!
started=0
for _ in $(seq 1 100); do
    if python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=1)' \
        "http://127.0.0.1:${port}/health" 2>/dev/null; then
        started=1
        break
    fi
    kill -0 "${vm_pid}" 2>/dev/null || break
    sleep 0.1
done
kill "${vm_pid}" 2>/dev/null || true
wait "${vm_pid}" 2>/dev/null || true
vm_pid=""
[ "${started}" = 1 ] ||
    die "the unpacked victoria-metrics did not start: $(grep -m1 -E '\b(error|fatal|panic)\b' "${work}/log" || tail -n 1 "${work}/log")"
rm -rf "${work}"
echo "${LAYOUT}" >"${staging}/.headroom-installed"

debian_publish "${staging}" "${DEST}"
trap - EXIT
say "done: $(cat "${DEST}/versions") in ${BIN}"
echo "${BIN}"
