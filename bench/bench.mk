# sluice - bench/bench.mk: `make bench` (issue 5), included by the Makefile.
# Installs what the benchmark needs from Debian when missing (dpkg -s, then
# apt-get: needs root), builds sluice, and runs bench/run.py, which starts and
# stops its own upstream, redis-server, sluice, nginx and HAProxy on loopback.
# BENCH_ARGS passes options to run.py (e.g. BENCH_ARGS="--duration 5", or
# BENCH_ARGS="--groups h2,grpc,rls" for the HTTP/2, gRPC and RLS rows only).

BENCH_DEBS := wrk nginx haproxy redis-server gnuplot-nox nghttp2-client python3-grpcio python3-hpack
BENCH_ARGS ?=
BENCH_SLUICE ?= $(abspath $(or $(BUILD),build)/sluice)

.PHONY: bench bench-deps

bench-deps:
	@missing=""; for p in $(BENCH_DEBS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi

bench: bench-deps
	$(MAKE) all
	/usr/bin/python3 bench/run.py --sluice $(BENCH_SLUICE) $(BENCH_ARGS)

# `make bench-redis` (issue 11): Redis' own command time per decision, sluice's
# limit.lua next to a minimal fixed-window script, in one run against its own
# redis-server on 127.0.0.1. BENCH_REDIS_ARGS passes options to redis_cost.py
# (e.g. BENCH_REDIS_ARGS="--before /tmp/old-limit.lua --runs 3").
BENCH_REDIS_ARGS ?=

.PHONY: bench-redis

bench-redis:
	/usr/bin/python3 bench/redis_cost.py $(BENCH_REDIS_ARGS)

# `make bench-rows` (issue 11): bench rows 2 and 3 reduced to their Redis
# cost through sluice (Redis CPU per 10k requests, evalsha usec per
# decision, the batch sizes sluice formed), bench/redis_rows.py; needs wrk,
# nginx and redis-server. BENCH_ROWS_ARGS passes options (e.g.
# BENCH_ROWS_ARGS="--before /tmp/base/build/sluice --reps 3").
BENCH_ROWS_ARGS ?=

.PHONY: bench-rows

bench-rows: bench-deps
	$(MAKE) all
	/usr/bin/python3 bench/redis_rows.py --sluice $(BENCH_SLUICE) $(BENCH_ROWS_ARGS)
