#!/usr/bin/env bash
# Builds the Debian package: $CARGO_TARGET_DIR/debian/lockgate_<version>-1_<arch>.deb.
#
# The binary is built first; the man pages and shell completions are generated from it
# (the same clap definitions that parse the command line), then `cargo deb` packs
# them with the systemd unit and the examples (metadata: [package.metadata.deb] in
# Cargo.toml). Installs cargo-deb (into the target directory) and dpkg-dev (which
# computes the runtime dependencies) when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-$PWD/target}"
export CARGO_TARGET_DIR="$target"

if ! command -v dpkg-shlibdeps >/dev/null; then
  S=$([ "$(id -u)" = 0 ] || echo sudo)
  $S apt-get update -qq && $S env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dpkg-dev
fi
tools="$target/tools"
if ! [ -x "$tools/bin/cargo-deb" ]; then
  cargo install --quiet --locked cargo-deb --version 3.8.0 --root "$tools"
fi

cargo build --release --bin lockgate
assets="$target/release/deb-assets"
rm -rf "$assets"
mkdir -p "$assets/completions"
"$target/release/lockgate" manpages "$assets/man"
gzip -9n "$assets"/man/*.1
"$target/release/lockgate" completions bash > "$assets/completions/lockgate"
"$target/release/lockgate" completions zsh > "$assets/completions/_lockgate"
"$target/release/lockgate" completions fish > "$assets/completions/lockgate.fish"
"$tools/bin/cargo-deb" --no-build --package lockgate "$@"
