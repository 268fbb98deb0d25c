#!/usr/bin/env bash
# lockgate against Quix Streams on the demo's job: Kafka (4 partitions) -> rolling sum
# of `amount` by `user` -> Elasticsearch upsert of one document per user, exactly-once on
# both, on lockgate's embedded servers, one after the other. Prints each side's wall
# time, peak RSS and whether every user's total is exact, their ratios, and one JSON line.
#
# Build lockgate first, from the repository root:
#
#   cargo build --release
#   benches/peer/quix_compare.sh                 # 200,000 then 1,000,000 orders
#   benches/peer/quix_compare.sh 50000           # any counts of orders
#
# LOCKGATE_BIN: the binary (default: target/release/lockgate, under CARGO_TARGET_DIR if
# set). PEER_VENV: the virtual environment for Quix Streams (default:
# <target dir>/peer-venv; created on first use). PEER_WORK_DIR: where runs keep their
# servers' logs and state (default: the system's temporary directory). Needs python3
# (3.9 or later, with venv) and GNU time at /usr/bin/time.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
target="${CARGO_TARGET_DIR:-$repo/target}"
export LOCKGATE_BIN="${LOCKGATE_BIN:-$target/release/lockgate}"
venv="${PEER_VENV:-$target/peer-venv}"

# The versions measured; the Elasticsearch client of the 8 line speaks the API version
# the test server answers as (8.15).
QUIXSTREAMS_VERSION=3.28.1
ELASTICSEARCH_VERSION=8.19.3

if [ ! -x /usr/bin/time ]; then
    echo "error: /usr/bin/time (GNU time) is needed: apt-get install time" >&2
    exit 2
fi
if [ ! -x "$LOCKGATE_BIN" ]; then
    echo "error: no lockgate binary at $LOCKGATE_BIN: run \`cargo build --release\` first (or set LOCKGATE_BIN)" >&2
    exit 2
fi
if ! "$venv/bin/python" -c "import quixstreams, elasticsearch, sys; sys.exit(quixstreams.__version__ != '$QUIXSTREAMS_VERSION')" 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --upgrade pip
    "$venv/bin/pip" install --quiet "quixstreams[elasticsearch]==$QUIXSTREAMS_VERSION" "elasticsearch==$ELASTICSEARCH_VERSION"
fi
# Keep the repository free of bytecode caches.
export PYTHONDONTWRITEBYTECODE=1
exec "$venv/bin/python" -W ignore "$here/quix_compare.py" --python "$venv/bin/python" "$@"
