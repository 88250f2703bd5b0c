#!/usr/bin/env bash
# Checks that the whole workspace (libraries, tests, benches, examples, the lab) builds with
# the toolchain the workspace's rust-version names, or with the one given:
#
#     scripts/msrv.sh           # the workspace's rust-version
#     scripts/msrv.sh 1.83.0    # another toolchain (to find the oldest that works)
#
# It copies the committed tree to a scratch directory (the checkout's Cargo.lock and target
# directory stay untouched), sets rust-version to the toolchain tried, resolves dependencies
# to the newest versions that support it (cargo's MSRV-aware fallback resolver, as a user
# on that toolchain gets), and runs `cargo check --workspace --all-targets` with it.
# Installs the toolchain with rustup when it is missing. See docs/releasing.md.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
wanted="$(sed -n 's/^rust-version = "\(.*\)"/\1/p' "$root/Cargo.toml")"
toolchain="${1:-$wanted}"
case "$toolchain" in *.*.*) ;; *) toolchain="$toolchain.0" ;; esac
rustup toolchain list | grep -q "^$toolchain" || rustup toolchain install "$toolchain" --profile minimal
scratch="$(mktemp -d "${TMPDIR:-/tmp}/steady-msrv.XXXXXX")"
trap 'rm -rf "$scratch"' EXIT
git -C "$root" archive HEAD | tar -x -C "$scratch"
cd "$scratch"
sed -i "s/^rust-version = \".*\"/rust-version = \"${toolchain%.0}\"/" Cargo.toml
echo "== resolving for Rust $toolchain"
CARGO_RESOLVER_INCOMPATIBLE_RUST_VERSIONS=fallback cargo generate-lockfile
echo "== cargo +$toolchain check --workspace --all-targets"
CARGO_TARGET_DIR="$scratch/target" cargo "+$toolchain" check --workspace --all-targets
echo "== the workspace builds with Rust $toolchain"
