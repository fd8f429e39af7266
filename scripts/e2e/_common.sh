# shellcheck shell=bash
# Sourced by the e2e install scripts: progress lines, one-line failures, the shared cache and a lock.
#
# The caller sets SCRIPT_NAME before sourcing. Everything the installers build lives under
# HEADROOM_CACHE (outside the project, reused between runs and clones); the tests read the same
# variable (tests/e2e/harness.py), so both sides agree on where things are.

HEADROOM_CACHE="${VLLM_HEADROOM_CACHE:-${HOME}/.cache/vllm-headroom}"
_headroom_t0=$SECONDS

# say MESSAGE: one progress line on stderr, with the seconds elapsed since the script started.
say() { printf '[%s +%ds] %s\n' "${SCRIPT_NAME}" "$((SECONDS - _headroom_t0))" "$*" >&2; }

# die MESSAGE: the one line that says what failed and what to do, then exit 1.
die() {
    printf '%s: error: %s\n' "${SCRIPT_NAME}" "$*" >&2
    exit 1
}

# take_lock NAME: serialise concurrent installers (parallel CI jobs, two test sessions) on one
# cache entry. The lock is released when the script exits (the fd closes).
take_lock() {
    mkdir -p "${HEADROOM_CACHE}" || die "cannot create the cache directory ${HEADROOM_CACHE}; set VLLM_HEADROOM_CACHE to a writable directory"
    exec 9>"${HEADROOM_CACHE}/.$1.lock"
    if ! flock -n 9; then
        say "waiting for another installer holding ${HEADROOM_CACHE}/.$1.lock"
        flock 9 || die "could not lock ${HEADROOM_CACHE}/.$1.lock"
    fi
}

# as_root CMD...: run CMD as root (directly, or through sudo when we are not root).
as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo -n "$@"
    else
        die "need root for: $*; run this script as root or install sudo"
    fi
}

# Cached virtual environments (tools too big or too pinned for the project's own .venv). A
# complete one has a stamp file naming what was installed; anything else is rebuilt.

# venv_complete VENV WANT EXE: true when VENV's executable EXE runs and its stamp reads WANT.
venv_complete() { [ -x "$1/$3" ] && [ "$(cat "$1/.headroom-installed" 2>/dev/null)" = "$2" ]; }

# reuse_venv_or_lock NAME VENV WANT EXE PRINT: when VENV is complete, print PRINT and exit 0;
# else take the lock NAME and check again (a concurrent installer may have finished meanwhile).
# Returns, holding the lock, only when the caller has to build VENV.
reuse_venv_or_lock() {
    if venv_complete "$2" "$3" "$4"; then
        say "$1 already installed"
        echo "$5"
        exit 0
    fi
    take_lock "$1"
    if venv_complete "$2" "$3" "$4"; then
        say "$1 installed by a concurrent run"
        echo "$5"
        exit 0
    fi
}

# fresh_venv PY VENV: remove whatever is at VENV and create an empty virtual environment there.
fresh_venv() {
    rm -rf "$2"
    "$1" -m venv "$2" || die "could not create a virtual environment at $2 with $1"
}

# stamp_venv VENV WANT: mark VENV complete (the last step, after its check passed).
stamp_venv() { echo "$2" >"$1/.headroom-installed"; }
