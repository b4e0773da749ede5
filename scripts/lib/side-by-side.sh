# Shared by the benchmarks that run dinomo (`dinomo up`, release build) and redis-server (appendonly yes,
# appendfsync everysec) side by side on this machine: `source` it, then call `start_side_by_side KNS [ARGS...]`
# (ARGS go to `dinomo up`) and `load_both KEYSPACE VALUE_SIZE`. It sets DINOMO_PORT and REDIS_PORT, and stops
# both servers and removes their data when the script exits. DINOMO: a dinomo binary to run instead of building
# target/release/dinomo.

for tool in redis-server redis-benchmark redis-cli /usr/bin/python3; do
  command -v "$tool" >/dev/null || {
    echo "error: $tool not found (apt-get install redis-server redis-tools python3-redis)" >&2
    exit 1
  }
done
if [ -z "${DINOMO:-}" ]; then
  cargo build --release -p dinomo >&2
  DINOMO=target/release/dinomo
fi

free_port() {
  /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

WORK=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -INT "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

# Starts redis-server and `dinomo up --kns $1` (with the further arguments) on free loopback ports, and waits
# until both answer.
start_side_by_side() {
  local kns=$1
  shift
  REDIS_PORT=$(free_port)
  local rn_port
  rn_port=$(free_port)
  mkdir -p "$WORK/redis"
  redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --dir "$WORK/redis" --save "" \
    --appendonly yes --appendfsync everysec --daemonize no --logfile "$WORK/redis.log" &
  pids+=($!)
  # `up` gives its KV nodes consecutive ports from --resp-listen on: its first node's port is asked for last.
  DINOMO_LOG=warn "$DINOMO" up --kns "$kns" --data-dir "$WORK/dinomo" "$@" \
    --rn-listen "127.0.0.1:$rn_port" --resp-listen "127.0.0.1:0" >"$WORK/dinomo.out" 2>"$WORK/dinomo.err" &
  pids+=($!)
  DINOMO_PORT=
  for _ in $(seq 1 300); do
    DINOMO_PORT=$(sed -n 's/.*Redis protocol on 127\.0\.0\.1:\([0-9]*\).*/\1/p' "$WORK/dinomo.out" | head -1)
    [ -n "$DINOMO_PORT" ] && [ "$(redis-cli -p "$DINOMO_PORT" PING 2>/dev/null)" = "PONG" ] && break
    sleep 0.1
  done
  [ -n "$DINOMO_PORT" ] || { echo "error: dinomo did not start" >&2; cat "$WORK/dinomo.err" >&2; exit 1; }
  for _ in $(seq 1 300); do
    [ "$(redis-cli -p "$REDIS_PORT" PING 2>/dev/null)" = "PONG" ] && break
    sleep 0.1
  done
}

# Writes the same keys (redis-benchmark's key:NNNNNNNNNNNN names, about 86% of a keyspace of $1) with $2-byte
# values into both.
load_both() {
  for port in "$DINOMO_PORT" "$REDIS_PORT"; do
    redis-benchmark -p "$port" -t set -r "$1" -n $(($1 * 2)) -d "$2" -c 50 -P 16 -q >/dev/null
  done
}
