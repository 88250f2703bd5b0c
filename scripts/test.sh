#!/usr/bin/env bash
# The project's test command (README, `.ci/run`): installs Debian's etcd-server when no
# `etcd` is on PATH, then runs the whole workspace's tests with the etcd tests mandatory
# (STEADY_REQUIRE_ETCD=1: a test that cannot start etcd fails instead of skipping).
# Extra arguments go to `cargo test`, e.g. `scripts/test.sh -- --nocapture`.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v etcd >/dev/null 2>&1; then
    echo "== etcd not on PATH: installing Debian's etcd-server"
    sudo=()
    if [ "$(id -u)" -ne 0 ]; then
        sudo=(sudo)
    fi
    export DEBIAN_FRONTEND=noninteractive
    if ! "${sudo[@]}" apt-get install -y etcd-server; then
        # A fresh machine or container may have no package lists yet.
        "${sudo[@]}" apt-get update
        "${sudo[@]}" apt-get install -y etcd-server
    fi
fi
echo "== $(etcd --version | head -n 1)"

export STEADY_REQUIRE_ETCD=1
echo "== cargo test --workspace $*"
cargo test --workspace "$@"
