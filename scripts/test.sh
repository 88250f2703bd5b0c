#!/usr/bin/env bash
# The project's test command (README, `.ci/run`): installs what the tests need when it is
# missing (Debian's etcd-server for the etcd tests, Debian's chromium for the status page's
# browser test), then runs the whole workspace's tests with both kinds mandatory
# (STEADY_REQUIRE_ETCD=1, STEADY_REQUIRE_BROWSER=1: a test that cannot start etcd or the
# browser fails instead of skipping).
# Extra arguments go to `cargo test`, e.g. `scripts/test.sh -- --nocapture`.
set -euo pipefail
cd "$(dirname "$0")/.."

# Installs the Debian package $2 unless the command $1 is on PATH.
install_missing() {
    local command="$1" package="$2"
    if command -v "$command" >/dev/null 2>&1; then
        return
    fi
    echo "== $command not on PATH: installing Debian's $package"
    local sudo=()
    if [ "$(id -u)" -ne 0 ]; then
        sudo=(sudo)
    fi
    export DEBIAN_FRONTEND=noninteractive
    if ! "${sudo[@]}" apt-get install -y "$package"; then
        # A fresh machine or container may have no package lists yet.
        "${sudo[@]}" apt-get update
        "${sudo[@]}" apt-get install -y "$package"
    fi
}

install_missing etcd etcd-server
install_missing chromium chromium
echo "== $(etcd --version | head -n 1)"
echo "== $(chromium --version 2>/dev/null || echo 'chromium: no version')"

export STEADY_REQUIRE_ETCD=1
export STEADY_REQUIRE_BROWSER=1
echo "== cargo test --workspace $*"
cargo test --workspace "$@"
