#!/usr/bin/env bash
# The whole suite as `make test` runs it, in less wall time than one pytest on two cores.
#
# pytest runs on one core; the other sat idle through the unit tests. So the suite runs in two
# phases:
#   1. Beside each other: the unit tests (pytest -m "not e2e", many with wall-clock bounds, at
#      normal priority) and, at `nice 19`, the tests that only render and check files with
#      Helm, promtool, kubernetes-validate and checkov (DETERMINISTIC below: no clock, no
#      server; about 4.5 minutes of one core). The niced run yields the CPU to the unit tests'
#      servers and subprocesses whenever they want it. When it ends, that core builds the
#      image for phase 2 (prebuild_image below).
#   2. Once both have ended: the end-to-end tests (a real vLLM on both cores, real
#      Prometheus and Alertmanager, timing bounds), in two lanes that never burst together
#      (tests/e2e/lanes.py): the main lane, and beside it the modules that start no shared vLLM,
#      which wait for the alerting scenario's minutes of waiting on its rules and run in them
#      (the main lane waits for them to end before its next module). With arguments (-k, a
#      path...) phase 2 is one pytest, as before.
# Every test runs exactly once: phase 2 is everything marked e2e that phase 1 did not run.
# Arguments are passed to every pytest (e.g. -x, -k). Exit status: the first failure's.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTEST=${PYTEST:-.venv/bin/pytest}

DETERMINISTIC=(
    tests/test_alerts.py
    tests/test_helm.py
    tests/test_recipes.py
    tests/test_helm_rules.py
    tests/test_checkov.py
    tests/test_dashboards.py
    tests/test_promql.py
    tests/sweep/test_runner.py
    tests/sizing
)
# The end-to-end modules of phase 2's beside lane: each starts its own vLLM or none
# (tests/e2e/lanes.py).
BESIDE=(
    tests/e2e/test_limits_e2e.py
    tests/e2e/test_sharding_e2e.py
)
ignore=()
for path in "${DETERMINISTIC[@]}"; do
    ignore+=("--ignore=$path")
done

side_log=$(mktemp "${TMPDIR:-/tmp}/vllm-headroom-tests.XXXXXX")
beside_log=$(mktemp "${TMPDIR:-/tmp}/vllm-headroom-beside.XXXXXX")
lanes_dir=$(mktemp -d "${TMPDIR:-/tmp}/vllm-headroom-lanes.XXXXXX")
image_log=$(mktemp "${TMPDIR:-/tmp}/vllm-headroom-image.XXXXXX")
beside=
trap '[ -n "$beside" ] && kill "$beside" 2>/dev/null; rm -rf "$side_log" "$beside_log" "$lanes_dir" "$image_log"' EXIT

# The file checks end about two minutes before the unit tests: that core then builds the image
# that phase 2's tests/e2e/test_image.py runs (scripts/image/build.sh, cached by its inputs; about
# 90 s cold, a no-op warm), so phase 2 finds it built. Whole suite, as root, tools present only
# (the module's own conditions); a failure here is only reported: phase 2 builds again and fails
# with the build's log.
prebuild_image() {
    local PATH="$PATH:/usr/sbin:/sbin" started=$SECONDS
    if [ "$#" -ne 0 ] || [ "$(id -u)" -ne 0 ] || ! command -v podman debootstrap >/dev/null; then
        return 0
    fi
    if nice -n 19 bash scripts/image/build.sh >/dev/null 2>"$image_log"; then
        echo "== image prebuilt for phase 2 in $((SECONDS - started)) s (scripts/image/build.sh)"
    else
        echo "== image prebuild failed ($((SECONDS - started)) s); phase 2 builds it again:"
        tail -n 5 "$image_log"
    fi
}

SECONDS=0
echo "== phase 1: unit tests, with the file-checking tests beside them (nice 19; output below)"
{
    nice -n 19 "$PYTEST" -p no:cacheprovider "${DETERMINISTIC[@]}" "$@" >"$side_log" 2>&1
    checks_rc=$?
    prebuild_image "$@" >>"$side_log" 2>&1
    exit "$checks_rc"
} &
side=$!
"$PYTEST" -m "not e2e" "${ignore[@]}" "$@"
unit_rc=$?
wait "$side"
side_rc=$?
echo "== phase 1, beside: ${DETERMINISTIC[*]}"
cat "$side_log"

phase1_s=$SECONDS
# The slowest steps are listed: where the suite's time goes (issue 29's faster loop).
if [ "$#" -eq 0 ]; then
    beside_ignore=()
    for path in "${BESIDE[@]}"; do
        beside_ignore+=("--ignore=$path")
    done
    echo "== phase 2: end-to-end tests (real vLLM, Prometheus, Alertmanager); beside: ${BESIDE[*]}"
    HEADROOM_E2E_LANES=$lanes_dir HEADROOM_E2E_LANE=beside \
        "$PYTEST" -p no:cacheprovider -m e2e "${BESIDE[@]}" --durations=5 >"$beside_log" 2>&1 &
    beside=$!
    HEADROOM_E2E_LANES=$lanes_dir HEADROOM_E2E_LANE=main \
        "$PYTEST" -m e2e "${ignore[@]}" "${beside_ignore[@]}" --durations=15
    e2e_rc=$?
    wait "$beside"
    beside_rc=$?
    beside=
    echo "== phase 2, beside: ${BESIDE[*]}"
    cat "$beside_log"
else
    echo "== phase 2: end-to-end tests (real vLLM, Prometheus, Alertmanager), alone"
    "$PYTEST" -m e2e "${ignore[@]}" --durations=15 "$@"
    e2e_rc=$?
    beside_rc=0
fi
echo "== wall time: phase 1 ${phase1_s} s, phase 2 $((SECONDS - phase1_s)) s"

for rc in "$unit_rc" "$side_rc" "$e2e_rc" "$beside_rc"; do
    # 5 is pytest's "no tests collected": a -k or a path given here may select none in a phase.
    if [ "$rc" -ne 0 ] && ! { [ "$rc" -eq 5 ] && [ "$#" -gt 0 ]; }; then
        echo "make test: failed (unit $unit_rc, file checks $side_rc, end-to-end $e2e_rc," \
            "beside $beside_rc)" >&2
        exit "$rc"
    fi
done
echo "make test: every phase passed"
