#!/usr/bin/env bash
# Runs a command next to a real S3-compatible server on 127.0.0.1, then stops the server
# and deletes its data, also when the command fails or is interrupted.
#
#   scripts/s3-server.sh COMMAND [ARGS...]
#
# The server is tools/s3-test-server: s3s-fs (it checks SigV4 signatures and stores
# objects as plain files), built as a member of this workspace so that it shares the
# compiled tokio, hyper and the rest with Sluice (a fresh machine compiles only s3s and
# s3s-fs for it). It picks a free port itself and exits when this script goes away,
# even on SIGKILL. The command sees the server through:
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

# The same profile and features as the tests: a no-op once `cargo test` has built it.
cargo build --locked --quiet -p sluice-s3-test-server
BIN="${CARGO_TARGET_DIR:-$PWD/target}/debug/sluice-s3-test-server"

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

access_key="sluice-test-$RANDOM$RANDOM"
secret_key="sluice-secret-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
# The server's standard input is a pipe whose only writer is this shell (fd $keep): when
# this script dies, however, the pipe closes and the server exits.
exec {keep}> >(exec "$BIN" --host 127.0.0.1 --port 0 --access-key "$access_key" \
  --secret-key "$secret_key" --exit-on-stdin-eof "$root" >"$log" 2>&1)
pid=$!
endpoint=""
for _ in $(seq 200); do
  endpoint=$(sed -n 's/^listening on //p' "$log" 2>/dev/null || true)
  [ -n "$endpoint" ] && break
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.05
done
if [ -z "$endpoint" ]; then
  echo "error: the S3 test server did not start; its log:" >&2
  cat "$log" >&2 || true
  exit 1
fi
echo "== S3 server (s3s-fs) on $endpoint, data in $root" >&2

export SLUICE_TEST_S3_ENDPOINT="$endpoint"
export SLUICE_TEST_S3_ACCESS_KEY="$access_key"
export SLUICE_TEST_S3_SECRET_KEY="$secret_key"
export SLUICE_TEST_S3_ROOT="$root"
status=0
# The command does not inherit the pipe, so a process it leaves behind cannot keep the
# server alive.
"$@" {keep}>&- || status=$?
exit "$status"
