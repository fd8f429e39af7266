#!/usr/bin/env bash
# The whole suite as `make test` runs it, in less wall time than one pytest on two cores.
#
# pytest runs on one core; the other sat idle through the unit tests. So the suite runs in two
# phases:
#   1. Beside each other: the unit tests (pytest -m "not e2e", many with wall-clock bounds, at
#      normal priority) and, at `nice 19`, the tests that only render and check files with
#      Helm, promtool, kubernetes-validate and checkov (DETERMINISTIC below: no clock, no
#      server; about 4.5 minutes of one core). The niced run yields the CPU to the unit tests'
#      servers and subprocesses whenever they want it.
#   2. Alone, once both have ended: the end-to-end tests (a real vLLM on both cores, real
#      Prometheus and Alertmanager, timing bounds), as before.
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
ignore=()
for path in "${DETERMINISTIC[@]}"; do
    ignore+=("--ignore=$path")
done

side_log=$(mktemp "${TMPDIR:-/tmp}/vllm-headroom-tests.XXXXXX")
trap 'rm -f "$side_log"' EXIT

SECONDS=0
echo "== phase 1: unit tests, with the file-checking tests beside them (nice 19; output below)"
nice -n 19 "$PYTEST" -p no:cacheprovider "${DETERMINISTIC[@]}" "$@" >"$side_log" 2>&1 &
side=$!
"$PYTEST" -m "not e2e" "${ignore[@]}" "$@"
unit_rc=$?
wait "$side"
side_rc=$?
echo "== phase 1, beside: ${DETERMINISTIC[*]}"
cat "$side_log"

phase1_s=$SECONDS
echo "== phase 2: end-to-end tests (real vLLM, Prometheus, Alertmanager), alone"
# The slowest steps are listed: where the suite's time goes (issue 29's faster loop).
"$PYTEST" -m e2e "${ignore[@]}" --durations=15 "$@"
e2e_rc=$?
echo "== wall time: phase 1 ${phase1_s} s, phase 2 $((SECONDS - phase1_s)) s"

for rc in "$unit_rc" "$side_rc" "$e2e_rc"; do
    # 5 is pytest's "no tests collected": a -k or a path given here may select none in a phase.
    if [ "$rc" -ne 0 ] && ! { [ "$rc" -eq 5 ] && [ "$#" -gt 0 ]; }; then
        echo "make test: failed (unit $unit_rc, file checks $side_rc, end-to-end $e2e_rc)" >&2
        exit "$rc"
    fi
done
echo "make test: every phase passed"
