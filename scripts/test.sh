#!/usr/bin/env bash
# The project's test command (README, `.ci/run`): installs what the tests need when it is
# missing (Debian's etcd-server for the etcd tests, Debian's chromium for the status page's
# browser test, a Python virtual environment with grpcio for the A119 interop tests'
# Python peers), then runs the whole workspace's tests with every kind mandatory
# (STEADY_REQUIRE_ETCD=1, STEADY_REQUIRE_BROWSER=1, STEADY_REQUIRE_PYTHON_GRPC=1: a test
# that cannot start etcd, the browser or its Python peer fails instead of skipping).
# Extra arguments go to `cargo test`, e.g. `scripts/test.sh -- --nocapture`.
set -euo pipefail
cd "$(dirname "$0")/.."

# Installs the Debian package $1.
apt_install() {
    local package="$1"
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

# Installs the Debian package $2 unless the command $1 is on PATH.
install_missing() {
    local command="$1" package="$2"
    if command -v "$command" >/dev/null 2>&1; then
        return
    fi
    echo "== $command not on PATH: installing Debian's $package"
    apt_install "$package"
}

# The A119 interop tests' Python peers (tests/a119/) need grpcio, and grpcio-tools to
# generate their messages from proto/proto/autosharding.proto at test time (Debian's
# python3-grpc-tools is too old: its protoc refuses proto3 `optional`). They come from
# PyPI, pinned, into a virtual environment of the workspace's own, made when missing or
# holding other versions; the tests find it there (steady_testing::PYTHON_GRPC_VENV), or
# run the interpreter STEADY_PYTHON_GRPC_BIN names.
PYTHON_GRPC_VENV=target/python-grpc-venv
GRPCIO_VERSION=1.85.1
python_grpc_ready() {
    "$PYTHON_GRPC_VENV/bin/python" -c "
import grpc, grpc_tools.protoc
assert grpc.__version__ == '$GRPCIO_VERSION', grpc.__version__" >/dev/null 2>&1
}
if ! python_grpc_ready; then
    echo "== making $PYTHON_GRPC_VENV: grpcio and grpcio-tools $GRPCIO_VERSION from PyPI"
    install_missing python3 python3
    rm -rf "$PYTHON_GRPC_VENV"
    mkdir -p "$(dirname "$PYTHON_GRPC_VENV")"
    if ! python3 -m venv "$PYTHON_GRPC_VENV"; then
        # Debian's python3 makes environments only with python3-venv (ensurepip).
        rm -rf "$PYTHON_GRPC_VENV"
        apt_install python3-venv
        python3 -m venv "$PYTHON_GRPC_VENV"
    fi
    "$PYTHON_GRPC_VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
        "grpcio==$GRPCIO_VERSION" "grpcio-tools==$GRPCIO_VERSION"
    python_grpc_ready
fi

install_missing etcd etcd-server
install_missing chromium chromium
echo "== $(etcd --version | head -n 1)"
echo "== $(chromium --version 2>/dev/null || echo 'chromium: no version')"
echo "== $("$PYTHON_GRPC_VENV/bin/python" --version), grpcio $GRPCIO_VERSION in $PYTHON_GRPC_VENV"

export STEADY_REQUIRE_ETCD=1
export STEADY_REQUIRE_BROWSER=1
export STEADY_REQUIRE_PYTHON_GRPC=1
echo "== cargo test --workspace $*"
cargo test --workspace "$@"
