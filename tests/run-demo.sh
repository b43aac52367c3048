#!/usr/bin/env bash
# sluice - MIT licence.
# run-demo.sh BIN CONF: the `make run` demo. Starts a throwaway redis-server
# on 127.0.0.1:6379 and the echo upstream on 127.0.0.1:9000, then sluice with
# CONF on 127.0.0.1:8080 until Ctrl-C, SIGTERM or sluice's own exit. Without redis-server it
# runs conf/standalone.yaml (the in-process memory backend) instead, and a
# CONF with `backend: memory` needs no Redis either. Everything it started is
# stopped by PID on the way out; nothing else is touched.
#
# The ports come from the environment, today's defaults in brackets:
# DEMO_PORT (8080), DEMO_REDIS_PORT (6379), DEMO_UPSTREAM_PORT (9000) and
# DEMO_ADMIN_PORT (9901, conf/standalone.yaml's admin endpoint). They reach
# the config as SLUICE_LISTEN, SLUICE_REDIS_URL, SLUICE_UPSTREAM and
# SLUICE_ADMIN_LISTEN, which conf/sluice.yaml and conf/standalone.yaml read.
set -uo pipefail

if [ $# -ne 2 ]; then
    echo "usage: $0 BIN CONF" >&2
    exit 2
fi
BIN=$1
CONF=$2
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PORT=${DEMO_PORT:-8080}
REDIS_PORT=${DEMO_REDIS_PORT:-6379}
UPSTREAM_PORT=${DEMO_UPSTREAM_PORT:-9000}
ADMIN_PORT=${DEMO_ADMIN_PORT:-9901}
PYTHON=/usr/bin/python3     # Debian's, whatever python3 is first on PATH

REDIS_PID=""
UPSTREAM_PID=""
SLUICE_PID=""
TMPDIR_DEMO=$(mktemp -d /tmp/sluice-demo.XXXXXX)

die() { echo "run-demo: $*" >&2; exit 1; }

# 0 when something accepts TCP connections on 127.0.0.1:$1.
port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Wait up to ~5 s for a port to accept; fail when the process died first.
wait_port() {
    local port=$1 pid=$2 name=$3 i
    for i in $(seq 1 50); do
        port_busy "$port" && return 0
        kill -0 "$pid" 2>/dev/null || die "$name exited during start-up (log: $TMPDIR_DEMO/$name.log)"
        sleep 0.1
    done
    die "$name did not listen on 127.0.0.1:$port within 5 s (log: $TMPDIR_DEMO/$name.log)"
}

# Stop one process we started: SIGTERM, then SIGKILL after ~3 s.
stop_pid() {
    local pid=$1 i
    [ -n "$pid" ] || return 0
    kill -TERM "$pid" 2>/dev/null || return 0
    for i in $(seq 1 30); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
}

cleanup() {
    trap - EXIT INT TERM
    stop_pid "$SLUICE_PID"
    stop_pid "$UPSTREAM_PID"
    stop_pid "$REDIS_PID"
    rm -rf "$TMPDIR_DEMO"
}
trap cleanup EXIT
# wait returns early on these; the EXIT trap then stops everything.
trap 'exit 0' INT TERM

for p in "$PORT" "$REDIS_PORT" "$UPSTREAM_PORT" "$ADMIN_PORT"; do
    [[ "$p" =~ ^[0-9]{1,5}$ ]] && [ "$p" -ge 1 ] && [ "$p" -le 65535 ] ||
        die "'$p' is not a port (DEMO_PORT, DEMO_REDIS_PORT, DEMO_UPSTREAM_PORT, DEMO_ADMIN_PORT: 1..65535)"
done
export SLUICE_LISTEN=127.0.0.1:$PORT
export SLUICE_REDIS_URL=redis://127.0.0.1:$REDIS_PORT/0
export SLUICE_UPSTREAM=127.0.0.1:$UPSTREAM_PORT
export SLUICE_ADMIN_LISTEN=127.0.0.1:$ADMIN_PORT

[ -x "$BIN" ] || die "no executable '$BIN' (run make first)"
[ -r "$CONF" ] || die "cannot read config '$CONF'"
[ -x "$PYTHON" ] || die "$PYTHON is missing (apt-get install python3)"
[ -r "$ROOT/tests/upstream.py" ] || die "missing $ROOT/tests/upstream.py"

# Redis is needed unless the config keeps its counts in process.
USE_REDIS=1
grep -Eq '^backend:[[:space:]]*memory([[:space:]]|#|$)' "$CONF" && USE_REDIS=0
if [ "$USE_REDIS" = 1 ] && ! command -v redis-server >/dev/null; then
    CONF=$ROOT/conf/standalone.yaml
    USE_REDIS=0
    echo "run-demo: redis-server is not installed: running $CONF (memory backend) instead"
    [ -r "$CONF" ] || die "cannot read config '$CONF'"
fi

[ "$USE_REDIS" = 1 ] && port_busy "$REDIS_PORT" &&
    die "port $REDIS_PORT is already in use; stop the Redis (or whatever) listening there, or set DEMO_REDIS_PORT"
port_busy "$UPSTREAM_PORT" && die "port $UPSTREAM_PORT is already in use; the demo upstream needs it (set DEMO_UPSTREAM_PORT)"
port_busy "$PORT" && die "port $PORT is already in use; sluice needs it (set DEMO_PORT)"

if [ "$USE_REDIS" = 1 ]; then
    redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
        --dir "$TMPDIR_DEMO" >"$TMPDIR_DEMO/redis.log" 2>&1 &
    REDIS_PID=$!
    wait_port "$REDIS_PORT" "$REDIS_PID" redis
fi

"$PYTHON" "$ROOT/tests/upstream.py" --port "$UPSTREAM_PORT" >"$TMPDIR_DEMO/upstream.log" 2>&1 &
UPSTREAM_PID=$!
wait_port "$UPSTREAM_PORT" "$UPSTREAM_PID" upstream

if [ "$USE_REDIS" = 1 ]; then
    echo "run-demo: redis pid $REDIS_PID on :$REDIS_PORT, upstream pid $UPSTREAM_PID on :$UPSTREAM_PORT; starting $BIN -c $CONF"
    TRY_PATH=/
else
    echo "run-demo: no Redis (memory backend), upstream pid $UPSTREAM_PID on :$UPSTREAM_PORT; starting $BIN -c $CONF"
    TRY_PATH=/api               # conf/standalone.yaml: burst 10 there, 60/min elsewhere
fi
# One curl for 15 requests (URL globbing): fast enough to outrun a refill.
echo "run-demo: try it: curl -s -o /dev/null -w '%{http_code}\n' 'http://127.0.0.1:$PORT$TRY_PATH?[1-15]'   (Ctrl-C stops everything)"

# sluice runs in the background so that this shell can take SIGTERM while
# waiting; sluice sets its own SIGINT/SIGTERM handlers.
"$BIN" -c "$CONF" &
SLUICE_PID=$!
wait "$SLUICE_PID"
rc=$?
SLUICE_PID=""
exit "$rc"
