#!/usr/bin/env bash
# Runs a command next to a real S3-compatible server (s3s-fs, which checks SigV4
# signatures) on 127.0.0.1, then stops the server and deletes its data, also when the
# command fails or is interrupted.
#
#   scripts/s3-server.sh COMMAND [ARGS...]
#
# Installs s3s-fs into .tools/ on first use (cargo install, a few minutes). The command
# sees the server through:
#   SLUICE_TEST_S3_ENDPOINT    http://127.0.0.1:PORT
#   SLUICE_TEST_S3_ACCESS_KEY  the access key the server accepts
#   SLUICE_TEST_S3_SECRET_KEY  its secret key
#   SLUICE_TEST_S3_ROOT        the server's data directory (a bucket is a directory in it)
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$#" -eq 0 ]; then
  echo "usage: scripts/s3-server.sh COMMAND [ARGS...]" >&2
  exit 2
fi

S3S_VERSION=0.14.1
TOOLS="$PWD/.tools"
BIN="$TOOLS/bin/s3s-fs"
if [ ! -x "$BIN" ]; then
  echo "== installing s3s-fs $S3S_VERSION into .tools (once)" >&2
  # A target directory of its own, so that the workspace's build is not disturbed.
  CARGO_TARGET_DIR="$TOOLS/build" cargo install --locked --root "$TOOLS" \
    "s3s-fs@$S3S_VERSION" --features binary
  rm -rf "$TOOLS/build"
fi

root=$(mktemp -d "${TMPDIR:-/tmp}/sluice-s3.XXXXXX")
log="$root.log"
pid=""
cleanup() {
  if [ -n "$pid" ]; then
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  fi
  rm -rf "$root" "$log"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

access_key="sluice-test-$RANDOM$RANDOM"
secret_key="sluice-secret-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
started=""
for _ in 1 2 3 4 5; do
  port=$(free_port)
  "$BIN" --host 127.0.0.1 --port "$port" --access-key "$access_key" --secret-key "$secret_key" \
    "$root" >"$log" 2>&1 &
  pid=$!
  for _ in $(seq 100); do
    if ! kill -0 "$pid" 2>/dev/null; then
      break
    fi
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      started=1
      break
    fi
    sleep 0.05
  done
  [ -n "$started" ] && break
  # The port was taken in between, or the server failed: try another port.
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  pid=""
done
if [ -z "$started" ]; then
  echo "error: s3s-fs did not start; its log:" >&2
  cat "$log" >&2 || true
  exit 1
fi
echo "== S3 server (s3s-fs $S3S_VERSION) on http://127.0.0.1:$port, data in $root" >&2

export SLUICE_TEST_S3_ENDPOINT="http://127.0.0.1:$port"
export SLUICE_TEST_S3_ACCESS_KEY="$access_key"
export SLUICE_TEST_S3_SECRET_KEY="$secret_key"
export SLUICE_TEST_S3_ROOT="$root"
status=0
"$@" || status=$?
exit "$status"
