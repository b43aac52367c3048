#!/usr/bin/env bash
# sluice - MIT licence.
# images.sh: what `make test-docker` needs before it can build anything, done
# only when missing (the recipe of ../shared/PODMAN.md): podman, podman-compose,
# runc and debootstrap from apt; podman set to runc with capped rlimits; and
# the base images docker/ names, built locally (no registry is pulled from):
# debian:bookworm-slim from Debian's archive with debootstrap (minutes), and
# redis:7-bookworm on top of it. Needs root, as `make test` does.
set -euo pipefail

DEBIAN_IMAGE=docker.io/library/debian:bookworm-slim
REDIS_IMAGE=docker.io/library/redis:7-bookworm

say() { echo "images: $*"; }
die() { echo "images: $*" >&2; exit 1; }

install_packages() {
    local p missing=""
    for p in podman podman-compose runc debootstrap curl; do
        dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
    done
    [ -z "$missing" ] && return 0
    say "installing:$missing"
    apt-get update -qq
    # shellcheck disable=SC2086  # one word per package
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing
}

# podman's default rlimits are refused on such VMs and crun rejects hybrid
# cgroups. An existing containers.conf is someone's choice: left alone.
configure_podman() {
    local f=/etc/containers/containers.conf
    [ -e "$f" ] && return 0
    say "writing $f (runtime runc, capped ulimits)"
    mkdir -p /etc/containers
    cat >"$f" <<'CONF'
[containers]
default_ulimits = ["nofile=16384:16384", "nproc=16384:16384"]
[engine]
runtime = "runc"
CONF
}

build_debian() {
    local mirror rootfs
    podman image exists "$DEBIAN_IMAGE" && return 0
    mirror=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
    [ -n "$mirror" ] || mirror=http://deb.debian.org/debian
    rootfs=$(mktemp -d /tmp/sluice-rootfs.XXXXXX)
    say "building $DEBIAN_IMAGE with debootstrap from $mirror (takes minutes)"
    if ! timeout 900 debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >"$rootfs.log" 2>&1; then
        tail -n 20 "$rootfs.log" >&2
        rm -rf "$rootfs" "$rootfs.log"
        die "debootstrap failed"
    fi
    tar -C "$rootfs" -c . | podman import - localhost/debian:bookworm-slim
    podman tag localhost/debian:bookworm-slim "$DEBIAN_IMAGE"   # an unmodified FROM resolves locally
    rm -rf "$rootfs" "$rootfs.log"
}

build_redis() {
    podman image exists "$REDIS_IMAGE" && return 0
    say "building $REDIS_IMAGE on $DEBIAN_IMAGE"
    printf '%s\n' \
        "FROM $DEBIAN_IMAGE" \
        'RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends redis-server && rm -rf /var/lib/apt/lists/*' \
        'CMD ["redis-server","--bind","0.0.0.0","--protected-mode","no"]' \
        | podman build -t "$REDIS_IMAGE" -
}

[ "$(id -u)" -eq 0 ] || die "run as root (apt-get, podman networks)"
install_packages
configure_podman
build_debian
build_redis
say "ready: $(podman --version), podman-compose $(dpkg-query -W -f='${Version}' podman-compose)"
