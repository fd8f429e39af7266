#!/usr/bin/env bash
# The whole suite as `make test` runs it, in less wall time than one pytest on two cores.
#
# The whole suite (no arguments) runs in two phases:
#   1. The unit tests (pytest -m "not e2e"), in two pytest processes side by side, one per core:
#      tests/reliability (UNIT_SECOND below) and the rest, about 3.5 minutes each. Their
#      bounds are wall-clock ones and their servers and subprocesses short: a third of their time
#      is waiting, so the two share the cores without slowing each other much (measured: 205 s
#      and 203 s side by side, 393 s as one pytest).
#   2. The end-to-end tests (a real vLLM on both cores, real Prometheus and Alertmanager, timing
#      bounds), in two lanes that never burst together (tests/e2e/lanes.py). Both start with
#      phase 1, whose unit tests leave a third of the cores idle, and first run their tests that
#      start no vLLM and build no image; then the main lane's alerting scenario starts its vLLM,
#      Prometheus and Alertmanager and its idle minute passes. Its burst, as any test with a
#      vLLM, waits for the unit tests' end (tests/e2e/conftest.py). The beside lane holds the
#      modules that start no shared vLLM (BESIDE): its tests with a vLLM wait for the alerting
#      scenario's minutes of waiting on its rules and run in them; the main lane's next burst
#      waits for them to end (the sidecar scenario spends its idle half-minute meanwhile). Beside
#      both, at nice 19 and once the main lane is quiet too (tests/e2e/lanes.py), the image
#      build for tests/e2e/test_image.py (prebuild_image; scripts/image/build.sh takes a lock,
#      so the test's own build waits for it) and then the tests that only render and check files
#      with Helm, promtool, kubernetes-validate and checkov (DETERMINISTIC: no clock, no server;
#      about 4.5 minutes of one core): they fill the end-to-end tests' waiting, and under a
#      burst take about a ninth of a core from vLLM (nice 10 in the harness; the idle
#      scheduling class would take less, but at its weight, about 3 % of a core under a 120 s
#      burst, a render could outlast its 30 s subprocess timeout: estimated, not tried).
#      "nice N" here is scripts/niced: the session's niceness too, as Linux's scheduler
#      autogroups share the CPU between sessions as equals whatever the nice values in them
#      (with `nice` alone the file checks took half the CPU from vLLM's session under a burst,
#      and vLLM's took as much from the sidecar's and Prometheus's).
# With arguments (-k, -x, a path...) phase 1 is one pytest of the unit tests with the file checks
# beside it at nice 19, and phase 2 one pytest of the end-to-end tests, alone.
# Every test runs exactly once. Exit status: the first failure's.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTEST=${PYTEST:-.venv/bin/pytest}
PYTHON=${PYTHON:-.venv/bin/python}

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
# The unit tests of phase 1's second pytest (whole suite): about half of their time.
UNIT_SECOND=(
    tests/reliability
)
# The end-to-end modules of phase 2's beside lane: each starts its own vLLM or none
# (tests/e2e/lanes.py). Those with none (the sharding scenario's 45 s) run in phase 1.
BESIDE=(
    tests/e2e/test_limits_e2e.py
    tests/e2e/test_sharding_e2e.py
)
# pytest's --ignore for each path given.
ignore_args() {
    local path
    for path in "$@"; do
        printf -- '--ignore=%s\n' "$path"
    done
}
mapfile -t ignore < <(ignore_args "${DETERMINISTIC[@]}")

side_log=$(mktemp "${TMPDIR:-/tmp}/vllm-headroom-tests.XXXXXX")
unit_log=$(mktemp "${TMPDIR:-/tmp}/vllm-headroom-unit.XXXXXX")
beside_log=$(mktemp "${TMPDIR:-/tmp}/vllm-headroom-beside.XXXXXX")
main_log=$(mktemp "${TMPDIR:-/tmp}/vllm-headroom-main.XXXXXX")
lanes_dir=$(mktemp -d "${TMPDIR:-/tmp}/vllm-headroom-lanes.XXXXXX")
image_log=$(mktemp "${TMPDIR:-/tmp}/vllm-headroom-image.XXXXXX")
background=()
trap '[ "${#background[@]}" -gt 0 ] && kill "${background[@]}" 2>/dev/null;
    rm -rf "$side_log" "$unit_log" "$beside_log" "$main_log" "$lanes_dir" "$image_log"' EXIT

# The image that phase 2's tests/e2e/test_image.py runs (scripts/image/build.sh, cached by its
# inputs; about 90 s cold, a no-op warm), built before that test asks for it. Root and the tools
# present only (the module's own conditions); a failure here is only reported: the test builds
# again and fails with the build's log.
prebuild_image() {
    local PATH="$PATH:/usr/sbin:/sbin" started=$SECONDS
    if [ "$(id -u)" -ne 0 ] || ! command -v podman debootstrap >/dev/null; then
        return 0
    fi
    if scripts/niced 19 bash scripts/image/build.sh >/dev/null 2>"$image_log"; then
        echo "== image prebuilt for phase 2 in $((SECONDS - started)) s (scripts/image/build.sh)"
    else
        echo "== image prebuild failed ($((SECONDS - started)) s); phase 2 builds it again:"
        tail -n 5 "$image_log"
    fi
}

SECONDS=0
beside_rc=0
if [ "$#" -eq 0 ]; then
    mapfile -t second_ignore < <(ignore_args "${UNIT_SECOND[@]}")
    mapfile -t beside_ignore < <(ignore_args "${BESIDE[@]}")
    echo "== phase 1: unit tests, in two pytest processes; the second, ${UNIT_SECOND[*]}, below;" \
        "phase 2's two lanes start beside them, their tests with a vLLM held until they end"
    HEADROOM_E2E_LANES=$lanes_dir HEADROOM_E2E_LANE=main \
        "$PYTEST" -p no:cacheprovider -m e2e "${ignore[@]}" "${beside_ignore[@]}" \
        --durations=15 >"$main_log" 2>&1 &
    main_lane=$!
    HEADROOM_E2E_LANES=$lanes_dir HEADROOM_E2E_LANE=beside \
        "$PYTEST" -p no:cacheprovider -m e2e "${BESIDE[@]}" --durations=5 >"$beside_log" 2>&1 &
    beside_lane=$!
    "$PYTEST" -p no:cacheprovider -m "not e2e" "${UNIT_SECOND[@]}" >"$unit_log" 2>&1 &
    second_units=$!
    background=("$main_lane" "$beside_lane" "$second_units")
    "$PYTEST" -m "not e2e" "${ignore[@]}" "${second_ignore[@]}"
    unit_rc=$?
    wait "$second_units"
    second_rc=$?
    touch "$lanes_dir/units"
    background=("$main_lane" "$beside_lane")
    echo "== phase 1, second: ${UNIT_SECOND[*]}"
    cat "$unit_log"
    phase1_s=$SECONDS

    echo "== phase 2: end-to-end tests (real vLLM, Prometheus, Alertmanager), main lane (started" \
        "with phase 1); beside: ${BESIDE[*]}; at nice 19: the image and the file checks" \
        "(output below)"
    {
        # Not before the main lane's burst and stalled engine are over: the alerting scenario
        # runs alone, as the beside lane waits for it too (a CI run saw its stall burst end
        # unseen three times with these checks beside it).
        HEADROOM_E2E_LANES=$lanes_dir HEADROOM_E2E_LANE=beside \
            "$PYTHON" -c "from tests.e2e import lanes; lanes.wait_for_quiet()"
        prebuild_image
        scripts/niced 19 "$PYTEST" -p no:cacheprovider "${DETERMINISTIC[@]}"
    } >"$side_log" 2>&1 &
    file_checks=$!
    background+=("$file_checks")
    wait "$main_lane"
    e2e_rc=$?
    echo "== phase 2, main lane"
    cat "$main_log"
    wait "$beside_lane"
    beside_rc=$?
    echo "== phase 2, beside: ${BESIDE[*]}"
    cat "$beside_log"
    checks_started=$SECONDS
    wait "$file_checks"
    side_rc=$?
    background=()
    echo "== phase 2, at nice 19 (waited $((SECONDS - checks_started)) s for it): the image," \
        "${DETERMINISTIC[*]}"
    cat "$side_log"
else
    echo "== phase 1: unit tests, with the file-checking tests beside them (nice 19; output below)"
    scripts/niced 19 "$PYTEST" -p no:cacheprovider "${DETERMINISTIC[@]}" "$@" >"$side_log" 2>&1 &
    background=("$!")
    "$PYTEST" -m "not e2e" "${ignore[@]}" "$@"
    unit_rc=$?
    wait "${background[0]}"
    side_rc=$?
    background=()
    second_rc=0
    echo "== phase 1, beside: ${DETERMINISTIC[*]}"
    cat "$side_log"
    phase1_s=$SECONDS

    echo "== phase 2: end-to-end tests (real vLLM, Prometheus, Alertmanager), alone"
    "$PYTEST" -m e2e "${ignore[@]}" --durations=15 "$@"
    e2e_rc=$?
fi
echo "== wall time: phase 1 ${phase1_s} s, phase 2 $((SECONDS - phase1_s)) s"

for rc in "$unit_rc" "$second_rc" "$side_rc" "$e2e_rc" "$beside_rc"; do
    # 5 is pytest's "no tests collected": a -k or a path given here may select none in a phase.
    if [ "$rc" -ne 0 ] && ! { [ "$rc" -eq 5 ] && [ "$#" -gt 0 ]; }; then
        echo "make test: failed (unit $unit_rc and $second_rc, file checks $side_rc," \
            "end-to-end $e2e_rc, beside $beside_rc)" >&2
        exit "$rc"
    fi
done
echo "make test: every phase passed"
