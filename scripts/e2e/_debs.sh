# shellcheck shell=bash
# Sourced after _common.sh by install-prometheus.sh, install-alertmanager.sh and
# install-victoria-metrics.sh: fetch Debian packages with apt and unpack them into the cache, as
# root or as any user, without installing them.
#
# apt reads the machine's own sources (/etc/apt/sources.list{,.d}: a corporate mirror configured
# there is used) and keyrings, so the Release files' signatures and the packages' hashes are checked
# exactly as for `apt-get install`. The package lists are private to the cache
# (${HEADROOM_CACHE}/apt), so no root is needed and the system's apt state is never touched:
#   -o Dir::State::Lists=<cache>   the lists `apt-get update` writes (non-root cannot write /var/lib/apt)
#   -o Dir::State::Status=/dev/null  ignore what dpkg has installed: candidates come from our lists only
#   -o Dir::Cache=<cache>          apt's binary cache, not /var/cache/apt
#   -o Debug::NoLocking=1          no lock files in system directories (the callers hold our own lock)

# debian_unpack STAGING PACKAGE...: download PACKAGE... (the current candidates of this machine's
# Debian release) and `dpkg -x` each into STAGING/root; record "package version" lines in
# STAGING/versions. STAGING must be an empty directory.
debian_unpack() {
    local staging=$1
    shift
    local tool
    for tool in apt-get dpkg dpkg-deb; do
        command -v "${tool}" >/dev/null 2>&1 ||
            die "${tool} not found; this installer unpacks Debian packages (Debian/Ubuntu), install ${*} another way and put them on PATH"
    done
    local apt_dir="${HEADROOM_CACHE}/apt"
    mkdir -p "${apt_dir}/lists/partial" "${apt_dir}/cache/archives/partial" ||
        die "cannot create ${apt_dir}; set VLLM_HEADROOM_CACHE to a writable directory"
    local opts=(
        -o "Dir::State::Lists=${apt_dir}/lists"
        -o "Dir::State::Status=/dev/null"
        -o "Dir::Cache=${apt_dir}/cache"
        -o "Debug::NoLocking=1"
    )
    # As root apt would drop to the _apt user, who cannot write into root's cache directory.
    if [ "$(id -u)" -eq 0 ]; then
        opts+=(-o "APT::Sandbox::User=root")
    fi

    say "apt-get update (private package lists in ${apt_dir}/lists; signatures checked)"
    apt-get -qq "${opts[@]}" update >&2 ||
        die "apt-get update failed (apt's message above); the Debian mirror of /etc/apt/sources.list* must be reachable"

    say "apt-get download $*"
    (cd "${staging}" && apt-get -qq "${opts[@]}" download "$@") >&2 ||
        die "apt-get download $* failed (apt's message above)"

    local deb
    mkdir -p "${staging}/root"
    for deb in "${staging}"/*.deb; do
        [ -e "${deb}" ] || die "apt-get download $* fetched nothing"
        dpkg -x "${deb}" "${staging}/root" || die "dpkg -x ${deb} failed"
        # shellcheck disable=SC2016 # dpkg-deb expands ${Package}, not the shell
        dpkg-deb --show --showformat='${Package} ${Version}\n' "${deb}" >>"${staging}/versions"
        rm -f "${deb}"
    done
}

# debian_publish STAGING DEST: move STAGING into place as DEST (replacing an older DEST), so that
# a reader sees either the old complete tree or the new complete one.
debian_publish() {
    local staging=$1 dest=$2
    rm -rf "${dest}.old"
    if [ -e "${dest}" ]; then
        mv "${dest}" "${dest}.old"
    fi
    mv "${staging}" "${dest}" || die "could not move ${staging} to ${dest}"
    rm -rf "${dest}.old"
}
