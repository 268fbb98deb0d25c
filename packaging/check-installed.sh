#!/usr/bin/env bash
# Installs the Debian package and checks it as an operator would use it: the binary
# in /usr/bin (--version, the demo), the man pages and completions, the example job
# files, the system user, and the lockgate@ unit. Where systemd runs, the unit is
# started and stopped for a job against test servers; where it does not (a container),
# the unit is checked with `systemd-analyze verify` and its ExecStart is run as the
# unit would run it: as the user lockgate, with STATE_DIRECTORY set, stopped by
# SIGTERM, which must end in a final checkpoint and exit 0.
#
# Usage: packaging/check-installed.sh path/to/lockgate_*.deb   (as root)
set -euo pipefail
deb="$(realpath "$1")"
say() { printf '== %s\n' "$*"; }
export DEBIAN_FRONTEND=noninteractive
unset LOCKGATE_LOG_FORMAT

# What the checks use: man, systemd-analyze, python3 (an HTTP client).
if ! command -v man >/dev/null || ! command -v systemd-analyze >/dev/null || ! command -v python3 >/dev/null; then
  apt-get update -qq && apt-get install -y -qq man-db systemd python3 >/dev/null
fi

say "installing $deb with apt (runtime dependencies from the archive)"
# --reinstall: a machine that already has this version gets this build.
apt-get install -y -qq --reinstall "$deb" >/dev/null
test "$(command -v lockgate)" = /usr/bin/lockgate
version="$(/usr/bin/lockgate --version)"
echo "$version"
if commit="$(git -C "$(dirname "$0")" rev-parse --short=12 HEAD 2>/dev/null)"; then
  grep -q "^commit: *$commit\$" <<<"$version" || { echo "/usr/bin/lockgate is not this build ($commit)"; exit 1; }
fi

say "man pages, completions, examples, user"
man -w lockgate-run
page="$(man -P cat lockgate-run 2>/dev/null)"; grep -q -- '--restore' <<<"$page"
page="$(man -P cat lockgate-checkpoints-alter 2>/dev/null)"; grep -q -- '--set-offset' <<<"$page"
for f in /usr/share/bash-completion/completions/lockgate \
         /usr/share/zsh/vendor-completions/_lockgate \
         /usr/share/fish/vendor_completions.d/lockgate.fish \
         /usr/share/doc/lockgate/examples/service.toml \
         /usr/share/doc/lockgate/examples/orders-to-es.toml \
         /lib/systemd/system/lockgate@.service; do
  test -s "$f" || { echo "missing: $f"; exit 1; }
done
getent passwd lockgate >/dev/null
test "$(stat -c %U /var/lib/lockgate)" = lockgate

work="$(mktemp -d)"
chmod 755 "$work"
pids=()
state=/var/lib/lockgate/check
cleanup() {
  if [ -d /run/systemd/system ]; then systemctl stop lockgate@check 2>/dev/null || true; fi
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  rm -rf "$work" "$state" /etc/lockgate/check.toml /etc/lockgate/check.token
}
trap cleanup EXIT

say "lockgate demo from /usr/bin"
(cd "$work" && /usr/bin/lockgate demo --dir "$work/demo" > "$work/demo.out" 2>&1) \
  || { tail -n 40 "$work/demo.out"; exit 1; }
tail -n 5 "$work/demo.out"

say "the systemd unit"
systemd-analyze verify /lib/systemd/system/lockgate@.service

# Test servers from the installed binary, on free ports: Kafka with 20,000 sample
# orders, and the Elasticsearch test server.
/usr/bin/lockgate testkit kafka --brokers 1 --topic orders:2 --orders orders:20000 \
  --bootstrap-file "$work/bootstrap" > /dev/null 2> "$work/kafka.log" &
pids+=($!)
/usr/bin/lockgate testkit es --listen 127.0.0.1:0 > "$work/es.url" 2> "$work/es.log" &
pids+=($!)
for _ in $(seq 600); do
  [ -s "$work/bootstrap" ] && [ -s "$work/es.url" ] && break
  sleep 0.1
done
[ -s "$work/bootstrap" ] && [ -s "$work/es.url" ] \
  || { echo "the test servers did not start"; cat "$work/kafka.log" "$work/es.log"; exit 1; }
bootstrap="$(cat "$work/bootstrap")"
es="$(head -n 1 "$work/es.url")"

# The shipped example, pointed at the test servers.
sed -e "s|^bootstrap_servers = .*|bootstrap_servers = \"$bootstrap\"|" \
    -e "s|^url = .*|url = \"$es\"|" \
    -e "s|^listen = .*|listen = \"127.0.0.1:0\"|" \
    -e "s|^token_file = .*|token_file = \"/etc/lockgate/check.token\"|" \
    /usr/share/doc/lockgate/examples/service.toml > /etc/lockgate/check.toml
head -c 24 /dev/urandom | base64 > /etc/lockgate/check.token
chgrp lockgate /etc/lockgate/check.toml /etc/lockgate/check.token
chmod 0640 /etc/lockgate/check.toml /etc/lockgate/check.token

count() {
  python3 -c 'import json,sys,urllib.request
try: print(json.load(urllib.request.urlopen(sys.argv[1] + "/orders/_count"))["count"])
except Exception: print(0)' "$es"
}
# Polls for the 20000 orders for up to 2 minutes, giving up early once `$1` (the job's
# pid, when known) is gone.
wait_for_orders() {
  for _ in $(seq 1200); do
    [ "$(count)" = 20000 ] && return 0
    if [ -n "${1:-}" ] && ! kill -0 "$1" 2>/dev/null; then break; fi
    sleep 0.1
  done
  echo "the job did not index the 20000 orders"; return 1
}

if [ -d /run/systemd/system ]; then
  say "systemd runs: systemctl start lockgate@check"
  systemctl daemon-reload
  systemctl start lockgate@check
  wait_for_orders
  systemctl stop lockgate@check
  test "$(systemctl show -p ExecMainStatus --value lockgate@check)" = 0
else
  say "no systemd here (PID 1 is $(cat /proc/1/comm)): running the unit's ExecStart as the unit would"
  rm -rf "$state"
  install -d -m 0750 -o lockgate -g lockgate "$state"
  cd "$state"   # the unit's WorkingDirectory
  exec_start="$(sed -n 's/^ExecStart=//p' /lib/systemd/system/lockgate@.service | sed 's/%i/check/g')"
  # shellcheck disable=SC2086
  # setpriv execs the job itself (as systemd does), so that SIGTERM reaches it directly.
  setpriv --reuid=lockgate --regid=lockgate --init-groups \
    env STATE_DIRECTORY="$state" $exec_start 2> "$work/job.log" &
  job=$!
  pids+=("$job")
  wait_for_orders "$job" || { tail -n 30 "$work/job.log"; exit 1; }
  kill -TERM "$job"   # KillSignal=SIGTERM
  # The unit's TimeoutStopSec.
  for _ in $(seq 1200); do kill -0 "$job" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$job" 2>/dev/null; then echo "still running 120 s after SIGTERM"; tail -n 30 "$work/job.log"; exit 1; fi
  status=0; wait "$job" || status=$?
  [ "$status" = 0 ] || { echo "the job exited $status on SIGTERM"; tail -n 30 "$work/job.log"; exit 1; }
  grep -q "is_final=true" "$work/job.log" || { echo "no final checkpoint"; tail -n 30 "$work/job.log"; exit 1; }
  test "$(stat -c %U "$state/checkpoints")" = lockgate
  /usr/bin/lockgate checkpoints list "$state/checkpoints" | tail -n 3
  cd /
fi
say "the package works"
