#!/usr/bin/env bash
# sluice - MIT licence.
# test-docker.sh: `make test-docker`. Builds the image, brings
# docker/docker-compose.yml up with podman-compose (project `sluice`: Redis,
# the echo upstream, two sluice replicas on 127.0.0.1:8081 and :8082), and
# checks that the replicas enforce ONE shared limit, that each really served
# its half, and that the image's HEALTHCHECK reports healthy. Everything it
# brought up is taken down again, on failure too. Exit 0 only if all passed.
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PROJECT=sluice
PORT1=${SLUICE1_PORT:-8081}
PORT2=${SLUICE2_PORT:-8082}
LIMIT=10                        # requests per 1m fixed window, per client
# The compose file reads these from the environment: pin what the checks
# below assume, whatever the caller's shell has set.
export SLUICE_LIMIT=$LIMIT SLUICE_WINDOW=1m SLUICE_ON_ERROR=allow SLUICE_WORKERS=1
export SLUICE1_PORT=$PORT1 SLUICE2_PORT=$PORT2
UP_TIMEOUT_S=900                # image builds on a cold cache take minutes
READY_TIMEOUT_S=60
LOG=$(mktemp /tmp/sluice-docker.XXXXXX)
STARTED=0
FAILS=0

say() { echo "test-docker: $*"; }
die() { echo "test-docker: FAIL: $*" >&2; exit 1; }
check() {                       # check DESCRIPTION COMMAND...: counts, never exits
    local what=$1; shift
    if "$@"; then say "ok   $what"; else say "FAIL $what"; FAILS=$((FAILS + 1)); fi
}

containers() { podman ps -a -q --filter "label=com.docker.compose.project=$PROJECT"; }
container_of() {
    podman ps -q --filter "label=com.docker.compose.project=$PROJECT" \
        --filter "label=com.docker.compose.service=$1" | head -n1
}

# Only what this run started is taken down: the project's containers and
# its network. Logs of the sluice replicas first, when something failed.
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    if [ "$STARTED" = 1 ]; then
        if [ "$rc" -ne 0 ] || [ "$FAILS" -ne 0 ]; then
            for s in sluice1 sluice2; do
                c=$(container_of "$s")
                [ -n "$c" ] && { echo "--- logs of $s"; podman logs --tail 30 "$c" 2>&1; }
            done
        fi
        say "tearing down"
        (cd "$ROOT/docker" && timeout 120 podman-compose -p "$PROJECT" down >>"$LOG" 2>&1)
        podman network exists "${PROJECT}_default" && podman network rm "${PROJECT}_default" >>"$LOG" 2>&1
        [ -z "$(containers)" ] || say "WARNING: containers of project $PROJECT remain"
    fi
    rm -f "$LOG"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# curl_status PORT [HEADERS_FILE]: one GET / on a replica; prints the status.
curl_status() {
    curl -s -o /dev/null -w '%{http_code}' --max-time 5 ${2:+-D "$2"} "http://127.0.0.1:$1/"
}
header() { tr -d '\r' <"$2" | awk -v h="$1" 'tolower($1) == tolower(h) ":" {print $2; exit}'; }

# A replica's admin endpoint is not published: ask from inside its container.
admin_get() { podman exec "$1" curl -fsS --max-time 3 "http://127.0.0.1:9901$2"; }
metric() { admin_get "$1" /metrics | awk -v m="$2" '$1 == m {print $2; exit}'; }

# --- preparation -----------------------------------------------------------
command -v curl >/dev/null || die "curl is missing"
"$ROOT/tests/docker/images.sh" || die "could not prepare podman and the base images"
[ -z "$(containers)" ] || die "containers of compose project '$PROJECT' exist already; not touching them"
port_busy "$PORT1" && die "127.0.0.1:$PORT1 is in use"
port_busy "$PORT2" && die "127.0.0.1:$PORT2 is in use"

say "building localhost/sluice"
(cd "$ROOT" && podman build --format docker -f docker/Dockerfile -t localhost/sluice . >"$LOG" 2>&1) \
    || { tail -n 30 "$LOG" >&2; die "podman build failed"; }
hc=$(podman image inspect --format '{{if .Config.Healthcheck}}{{join .Config.Healthcheck.Test " "}}{{end}}' localhost/sluice)
check "the image has a HEALTHCHECK ($hc)" grep -q '/healthz' <<<"$hc"

say "podman-compose -p $PROJECT up -d --build"
STARTED=1
(cd "$ROOT/docker" && BUILDAH_FORMAT=docker timeout "$UP_TIMEOUT_S" \
     podman-compose -p "$PROJECT" up -d --build >>"$LOG" 2>&1) \
    || { tail -n 30 "$LOG" >&2; die "podman-compose up failed"; }

# --- both replicas ready: admin answers and Redis connected ----------------
C1="" C2=""
deadline=$((SECONDS + READY_TIMEOUT_S))
while :; do
    C1=$(container_of sluice1) C2=$(container_of sluice2)
    if [ -n "$C1" ] && [ -n "$C2" ] &&
       [ "$(metric "$C1" sluice_redis_connected 2>/dev/null)" -ge 1 ] 2>/dev/null &&
       [ "$(metric "$C2" sluice_redis_connected 2>/dev/null)" -ge 1 ] 2>/dev/null &&
       port_busy "$PORT1" && port_busy "$PORT2"; then
        break
    fi
    [ "$SECONDS" -lt "$deadline" ] || die "replicas not ready (Redis connected, ports open) within ${READY_TIMEOUT_S}s"
    sleep 1
done
say "replicas ready: sluice1 $C1 on :$PORT1, sluice2 $C2 on :$PORT2"

# --- one limit across two replicas ------------------------------------------
# The fixed window is aligned to whole minutes on Redis' clock (this host's):
# start early in a minute so the 12 requests below cannot straddle two windows.
sec=$((10#$(date +%S)))
if [ "$sec" -ge 45 ]; then
    say "waiting $((61 - sec))s for a fresh minute (fixed window)"
    sleep $((61 - sec))
fi
hdr=$(mktemp /tmp/sluice-docker-hdr.XXXXXX)
remaining_ok=1
statuses=""
for i in $(seq 1 $((LIMIT + 2))); do
    port=$PORT1; [ $((i % 2)) -eq 0 ] && port=$PORT2
    st=$(curl_status "$port" "$hdr")
    statuses="$statuses $st"
    rem=$(header X-RateLimit-Remaining "$hdr")
    if [ "$i" -le "$LIMIT" ]; then
        # The count is Redis', shared: replica 2 sees what replica 1 spent.
        [ "$st" = 200 ] && [ "$rem" = $((LIMIT - i)) ] || remaining_ok=0
    else
        [ "$st" = 429 ] && [ "$rem" = 0 ] || remaining_ok=0
        retry=$(header Retry-After "$hdr")
    fi
done
rm -f "$hdr"
say "statuses, alternating :$PORT1/:$PORT2:$statuses"
check "the first $LIMIT requests pass, the next 2 get 429 on both replicas, Remaining counts down across them" \
    [ "$remaining_ok" = 1 ]
check "a 429 carries Retry-After >= 1 (got '${retry:-}')" [ "${retry:-0}" -ge 1 ]
# Each replica decided its own half: 5 allowed and 1 limited each.
a1=$(metric "$C1" 'sluice_requests_total{route="default",decision="allowed"}')
a2=$(metric "$C2" 'sluice_requests_total{route="default",decision="allowed"}')
l1=$(metric "$C1" 'sluice_requests_total{route="default",decision="limited"}')
l2=$(metric "$C2" 'sluice_requests_total{route="default",decision="limited"}')
ok=0
[ "${a1:-}" = $((LIMIT / 2)) ] && [ "${a2:-}" = $((LIMIT / 2)) ] && [ "${l1:-}" = 1 ] && [ "${l2:-}" = 1 ] && ok=1
check "each replica allowed $((LIMIT / 2)) and limited 1 (sluice1 ${a1:-?}/${l1:-?}, sluice2 ${a2:-?}/${l2:-?})" \
    [ "$ok" = 1 ]

# --- health ------------------------------------------------------------------
for c in "$C1" "$C2"; do
    # podman 4.3 prints "unhealthy" and exits 1, or prints nothing and
    # exits 0; the container's recorded status tells the same.
    out=$(podman healthcheck run "$c" 2>&1); rc=$?
    status=$(podman inspect --format '{{.State.Health.Status}}' "$c" 2>/dev/null)
    ok=0; [ "$rc" -eq 0 ] && [ "$status" = healthy ] && ok=1
    check "podman healthcheck run $(podman inspect --format '{{.Name}}' "$c"): exit $rc, status '$status'${out:+, '$out'}" \
        [ "$ok" = 1 ]
done
# The check really asks sluice: a stopped (SIGSTOP) sluice1 is unhealthy.
podman kill -s STOP "$C1" >/dev/null
out=$(podman healthcheck run "$C1" 2>&1); rc=$?
podman kill -s CONT "$C1" >/dev/null
check "a frozen sluice1 is reported unhealthy: exit $rc, '$out'" [ "$rc" -ne 0 ]
readyz_ok() { admin_get "$1" /readyz >/dev/null; }
check "/readyz answers 200 on sluice1" readyz_ok "$C1"

# --- SIGTERM: a replica stops promptly and cleanly --------------------------
t0=$SECONDS
podman stop -t 10 "$C2" >/dev/null 2>&1
took=$((SECONDS - t0))
code=$(podman inspect --format '{{.State.ExitCode}}' "$C2")
ok=0; [ "${code:-}" = 0 ] && [ "$took" -lt 8 ] && ok=1
check "sluice2 stopped on SIGTERM in ${took}s with exit status ${code:-?}" [ "$ok" = 1 ]

[ "$FAILS" -eq 0 ] || die "$FAILS check(s) failed"
say "PASS"
