#!/usr/bin/env bash
# Unpack Alertmanager (and amtool) from Debian's `prometheus-alertmanager` package into the cache,
# make it start without the package installed, then print the directory that holds `alertmanager`.
#
#   scripts/e2e/install-alertmanager.sh      # -> ${VLLM_HEADROOM_CACHE:-~/.cache/vllm-headroom}/alertmanager/bin
#
# As root or as any user, like install-prometheus.sh (apt-get download + dpkg -x, scripts/e2e/_debs.sh).
#
# Debian's build reads its default notification templates from a directory compiled into the
# binary, /usr/share/prometheus/alertmanager (no flag; `templates:` in the config only adds
# files): unpacked elsewhere it exits at start with "failed to parse templates: open
# /usr/share/prometheus/alertmanager/default.tmpl: no such file or directory". We rewrite that
# compiled-in path, with one of the same length (34 bytes; the binary's three occurrences: the
# directory, ui/ and no-ui), to /proc/self/fd/7/ followed by slashes, and bin/alertmanager, a
# two-line wrapper, opens the unpacked directory as file descriptor 7 before exec'ing the binary.
# So `bin/alertmanager --config.file=... --storage.path=... --web.listen-address=127.0.0.1:0
# --cluster.listen-address=` works from any directory, as any user, with no namespace or mount.
# The install ends by starting it that way once (loopback, clustering off) and stops it.
# Idempotent: a complete unpacked tree is reused at once.
set -euo pipefail
SCRIPT_NAME=install-alertmanager
# shellcheck source=scripts/e2e/_common.sh
. "$(dirname "$0")/_common.sh"
# shellcheck source=scripts/e2e/_debs.sh
. "$(dirname "$0")/_debs.sh"

DEST="${HEADROOM_CACHE}/alertmanager"
BIN="${DEST}/bin"
LAYOUT="alertmanager+amtool from Debian, templates via /proc/self/fd/7, layout 1"
SHARE=/usr/share/prometheus/alertmanager
FD_PATH=/proc/self/fd/7///////////////////

installed() {
    [ -x "${BIN}/alertmanager" ] && [ -x "${BIN}/amtool" ] &&
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

command -v python3 >/dev/null 2>&1 || die "python3 not found; it rewrites the template path in the binary"

staging="$(mktemp -d "${HEADROOM_CACHE}/.alertmanager.XXXXXX")"
chmod 0755 "${staging}"
am_pid=""
cleanup() {
    if [ -n "${am_pid}" ]; then
        kill "${am_pid}" 2>/dev/null || true
    fi
    rm -rf "${staging}"
}
trap cleanup EXIT

say "step 1/3: fetching and unpacking Debian's prometheus-alertmanager package (about 11 MB)"
debian_unpack "${staging}" prometheus-alertmanager
[ -f "${staging}/root${SHARE}/default.tmpl" ] ||
    die "the package has no ${SHARE}/default.tmpl; Debian changed its layout, update install-alertmanager.sh"

say "step 2/3: pointing the binary's template directory at file descriptor 7"
python3 - "${staging}/root/usr/bin/prometheus-alertmanager" "${SHARE}" "${FD_PATH}" <<'PY' ||
import os
import sys

path, old, new = sys.argv[1], sys.argv[2].encode(), sys.argv[3].encode()
assert len(old) == len(new), (old, new)
data = open(path, "rb").read()
count = data.count(old)
if count != 3:
    sys.exit(f"expected 3 occurrences of {old.decode()} in {path}, found {count}")
tmp = path + ".tmp"
with open(tmp, "wb") as out:
    out.write(data.replace(old, new))
os.chmod(tmp, 0o755)
os.replace(tmp, path)
PY
    die "could not rewrite the template path in prometheus-alertmanager; Debian's build changed, update install-alertmanager.sh"
mkdir -p "${staging}/bin"
cat >"${staging}/bin/alertmanager" <<'SH'
#!/bin/sh
# Debian's prometheus-alertmanager, unpacked by scripts/e2e/install-alertmanager.sh: its compiled-in
# template directory was rewritten to /proc/self/fd/7/, which this opens on the unpacked copy.
here="$(dirname "$(readlink -f "$0")")/.."
exec 7<"${here}/root/usr/share/prometheus/alertmanager" || exit 1
exec "${here}/root/usr/bin/prometheus-alertmanager" "$@"
SH
chmod 0755 "${staging}/bin/alertmanager"
ln -s ../root/usr/bin/amtool "${staging}/bin/amtool"

say "step 3/3: starting it once (127.0.0.1, clustering off)"
version="$("${staging}/bin/alertmanager" --version 2>&1 | head -n 1)" ||
    die "the unpacked alertmanager does not run on this machine: ${version}"
work="${staging}/check"
mkdir -p "${work}"
cat >"${work}/am.yml" <<'YML'
route: {receiver: none}
receivers: [{name: none}]
YML
"${staging}/bin/alertmanager" --config.file="${work}/am.yml" --storage.path="${work}/data" \
    --web.listen-address=127.0.0.1:0 --cluster.listen-address= >"${work}/log" 2>&1 &
am_pid=$!
started=0
for _ in $(seq 1 100); do
    if grep -q 'msg="Listening on"' "${work}/log"; then
        started=1
        break
    fi
    kill -0 "${am_pid}" 2>/dev/null || break
    sleep 0.1
done
kill "${am_pid}" 2>/dev/null || true
wait "${am_pid}" 2>/dev/null || true
am_pid=""
[ "${started}" = 1 ] ||
    die "the unpacked alertmanager did not start: $(grep -m1 -E 'level=(error|ERROR)' "${work}/log" || tail -n 1 "${work}/log")"
rm -rf "${work}"
echo "${LAYOUT}" >"${staging}/.headroom-installed"

debian_publish "${staging}" "${DEST}"
trap - EXIT
say "done: ${version} in ${BIN}"
echo "${BIN}"
