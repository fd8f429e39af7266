#!/usr/bin/env bash
# Install Prometheus and promtool from Debian's `prometheus` package, then print their directory.
#
#   scripts/e2e/install-prometheus.sh        # needs root (or sudo) the first time
#
# Idempotent: when both `prometheus` and `promtool` are on PATH nothing is installed. We install
# without recommends (no node exporter), and the package's service is never started by us: the
# tests start their own Prometheus on loopback with a generated config (tests/e2e/harness.py).
set -euo pipefail
SCRIPT_NAME=install-prometheus
# shellcheck source=scripts/e2e/_common.sh
. "$(dirname "$0")/_common.sh"

have_both() { command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; }

if have_both; then
    say "$(prometheus --version 2>&1 | head -n 1)"
    dirname "$(command -v prometheus)"
    exit 0
fi

command -v apt-get >/dev/null 2>&1 ||
    die "prometheus/promtool are not on PATH and apt-get is missing; install Prometheus 2.x (with promtool) and put both on PATH"

say "step 1/2: apt-get update"
as_root env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 update -qq >&2 ||
    die "apt-get update failed; the Debian mirror must be reachable"

say "step 2/2: apt-get install prometheus (brings promtool)"
# policy-rc.d exit 101 is Debian's documented way to keep a package's postinst from starting its
# service (in containers there is usually no init anyway). We only add it if none exists.
policy=/usr/sbin/policy-rc.d
added_policy=0
if [ ! -e "${policy}" ]; then
    as_root sh -c "printf '#!/bin/sh\nexit 101\n' >${policy} && chmod 0755 ${policy}" && added_policy=1
fi
status=0
as_root env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends prometheus >&2 || status=$?
if [ "${added_policy}" = 1 ]; then
    as_root rm -f "${policy}"
fi
[ "${status}" = 0 ] || die "apt-get install prometheus failed (exit ${status}); see apt's output above"

have_both || die "the prometheus package is installed but prometheus/promtool are not on PATH"
say "$(prometheus --version 2>&1 | head -n 1)"
dirname "$(command -v prometheus)"
