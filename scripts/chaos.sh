#!/usr/bin/env bash
# Random SIGKILLs against the delivery contract, with real processes (docs/protocol.md,
# "Failures"): each round starts three `sluice subscribe --reconnect` trainers and a
# fourth subscriber *before* the producer, SIGKILLs the fourth and the producer at a
# random moment (0.1 to 0.9 s into the run), restarts the producer with `--resume`
# when it was killed mid-stream, and checks that every trainer received every epoch
# exactly once with the source's checksum.
#
#   scripts/chaos.sh [ROUNDS] [--saturate] [--flight]
#
# --saturate keeps every core busy with `yes` loops for the whole run (a machine whose
# CPUs other processes saturate). --flight makes trainers 2 and 3 remote: each round
# starts a `sluice serve --flight` on 127.0.0.1 and they subscribe through it; trainer 2
# is stopped (SIGSTOP) when the producer is killed and continued (SIGCONT) a random
# 0-8 s after the restarted producer started, so the server must let go of the dead
# topic while its client reads nothing; the server must outlive every round. Uses target/debug/sluice (SLUICE_BIN to choose
# another), builds it if missing, and works in a temporary directory with a namespace
# of its own per round. Exits 1 if any round failed; CHAOS_KEEP=DIR keeps a failed
# round's outputs there.
set -uo pipefail
cd "$(dirname "$0")/.."
rounds=8
saturate=
flight=
for arg in "$@"; do
  case "$arg" in
    --saturate) saturate=1 ;;
    --flight) flight=1 ;;
    *[!0-9]* | '') echo "usage: scripts/chaos.sh [ROUNDS] [--saturate] [--flight]" >&2; exit 2 ;;
    *) rounds=$arg ;;
  esac
done
S=${SLUICE_BIN:-$PWD/target/debug/sluice}
if [ ! -x "$S" ]; then
  cargo build --locked -p sluice-cli || exit 1
fi
work=$(mktemp -d)
# Every process this script starts (the `yes` loops included), and only those, is
# killed at exit: a user's own `sluice` processes are left alone.
started=()
cleanup() {
  for pid in "${started[@]}"; do kill -9 "$pid" 2> /dev/null; done
  for ns in prep $(seq 1 "$rounds"); do
    rm -rf "/dev/shm/sluice-chaos$$-$ns" /dev/shm/iox2_sluice_chaos$$-"$ns"_* "/tmp/sluice-chaos$$-$ns.state"
  done
  rm -rf "$work"
}
trap cleanup EXIT
cd "$work"
SLUICE_NAMESPACE=chaos$$-prep "$S" demo --prepare-only --rows 50000 > prep.log 2>&1 || {
  cat prep.log
  exit 1
}
# The source's checksums: one epoch, and the whole stream of two.
epoch_sum=$("$S" checksum pipelines/demo.sql 2> /dev/null | awk '/checksum/ { print $NF }')
if [ -n "$saturate" ]; then
  for _ in $(seq "$(nproc)"); do
    yes > /dev/null &
    started+=($!)
    disown $! # no "Killed" notice from bash when cleanup ends it
  done
fi
failed=0
for round in $(seq 1 "$rounds"); do
  export SLUICE_NAMESPACE=chaos$$-$round
  remote=demo
  if [ -n "$flight" ]; then
    "$S" serve --flight 127.0.0.1:0 > serve.out 2> serve.err &
    server=$!
    started+=("$server")
    addr=
    for _ in $(seq 1 300); do
      addr=$(sed -n 's/^serving on //p' serve.out)
      [ -n "$addr" ] && break
      sleep 0.1
    done
    [ -n "$addr" ] || { echo "round $round: the Flight server did not start" >&2; cat serve.err; exit 1; }
    remote=flight://$addr/demo
  fi
  trainers=()
  for i in 1 2 3; do
    source=demo
    [ "$i" != 1 ] && source=$remote
    "$S" subscribe "$source" --json --timeout 60 --reconnect 30 --delay-ms 6 > "t$i.json" 2> "t$i.err" &
    trainers+=($!)
  done
  "$S" subscribe demo --json --timeout 60 --reconnect 30 > victim.json 2>&1 &
  victim=$!
  sleep "0.$((RANDOM % 5))"
  "$S" run pipelines/demo.sql --quiet --min-subscribers 4 --wait-timeout 60 > p1.log 2>&1 &
  producer=$!
  started+=("${trainers[@]}" "$victim" "$producer")
  sleep "0.$((RANDOM % 9 + 1))"
  [ -n "$flight" ] && kill -STOP "${trainers[1]}"
  kill -9 "$victim" 2> /dev/null
  killed=no
  kill -9 "$producer" 2> /dev/null && killed=yes
  wait "$producer" 2> /dev/null
  sleep "0.$((RANDOM % 5))"
  resumed=-
  if [ "$killed" = yes ]; then
    timeout 120 "$S" run pipelines/demo.sql --quiet --min-subscribers 3 --wait-timeout 60 \
      --resume > p2.log 2>&1 &
    second=$!
    started+=("$second")
    if [ -n "$flight" ]; then
      # Past the 5 s after which a restarted producer used to give up on a dead topic, or
      # not: it must take the topic over while this trainer reads nothing.
      sleep "$((RANDOM % 8)).$((RANDOM % 10))"
      kill -CONT "${trainers[1]}"
    fi
    wait "$second"
    resumed=$?
  fi
  [ -n "$flight" ] && kill -CONT "${trainers[1]}" 2> /dev/null
  # (Not a bare `wait`: the `yes` loops of --saturate are children too.)
  wait "${trainers[@]}" "$victim" 2> /dev/null
  server_ok=yes
  if [ -n "$flight" ]; then
    kill "$server" 2> /dev/null || server_ok=no
  fi
  ok=0
  for i in 1 2 3; do
    epochs=$(grep -c "\"checksum\":\"$epoch_sum\",\"complete\":true" "t$i.json")
    ends=$(grep -c '"end":true' "t$i.json")
    if [ "$epochs" = 2 ] && [ "$ends" = 1 ]; then ok=$((ok + 1)); fi
  done
  echo "round $round: producer killed mid-stream: $killed, resumed (exit): $resumed;" \
    "$ok of 3 trainers got both epochs exactly once${flight:+; Flight server alive: $server_ok}"
  if [ "$ok" != 3 ] || [ "$server_ok" != yes ]; then
    failed=$((failed + 1))
    tail -n 5 t1.err t2.err p1.log p2.log 2> /dev/null | cut -c1-300
    [ -n "$flight" ] && tail -n 5 serve.err | cut -c1-300
    if [ -n "${CHAOS_KEEP:-}" ]; then
      mkdir -p "$CHAOS_KEEP/round$round" && cp ./*.json ./*.err ./*.log ./*.out "$CHAOS_KEEP/round$round/" 2> /dev/null
    fi
  fi
done
echo "== $failed of $rounds rounds failed"
[ "$failed" = 0 ]
