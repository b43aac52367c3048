# sluice - build, run and test. Flags come from pkg-config; SANITIZE=1 builds
# with ASan and UBSan. `make test` and `make run` install what is missing
# from Debian's archive first, so a fresh Debian 12 machine needs nothing else.

CC       ?= cc
PKGS     := libevent libevent_pthreads hiredis yaml-0.1 libpcre2-8
# TLS for clients (src/net/tls_server.c): OpenSSL 3 under libevent's bufferevents
PKGS     += libevent_openssl openssl
# Envoy's RLS v3 messages (src/rls/proto): protoc-c's C, on libprotobuf-c
PKGS     += libprotobuf-c
# HTTP/2 framing and HPACK for clients (src/http2/): nghttp2, Debian's
# 1.52.0-1+deb12u3 or later (checked below: $(BUILD)/nghttp2.ok)
PKGS     += libnghttp2
CFLAGS   ?= -O2 -g
# src/ is in folders by layer (src/README.md); every folder is on the include
# path, so a file includes "mem.h", not "core/mem.h". Objects stay flat in
# build/ (file names are unique across folders).
SRC_DIRS := $(sort $(dir $(wildcard src/*/*.c src/*/*.h)))
SRC_INC  := $(patsubst %/,-I%,$(SRC_DIRS))
SRC_HDRS := $(wildcard src/*/*.h)
vpath %.c $(SRC_DIRS)
CFLAGS   += -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -Wshadow -Wno-unused-parameter -Wno-missing-field-initializers \
            $(SRC_INC) -Ibuild -I$(BUILD)/proto $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
LDLIBS   += $(shell pkg-config --libs $(PKGS) 2>/dev/null) -lhiredis -lpthread -lm
ifeq ($(SANITIZE),1)
CFLAGS   += -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
LDFLAGS  += -fsanitize=address,undefined
BUILD    := build/san
else
BUILD    := build
endif

PYTEST   := /usr/bin/python3 -m pytest
SRCS     := $(wildcard src/*/*.c)
SCRIPTS  := $(wildcard src/store/scripts/*.lua)
WEB      := $(sort $(wildcard src/admin/web/*))
# The .proto files the project writes from Envoy's published ones
# (src/rls/proto/PATH.proto) become $(BUILD)/proto/PATH.pb-c.[ch] and the
# objects $(BUILD)/NAME.pb-c.o (their base names are unique).
PROTOS   := $(shell find src/rls/proto -name '*.proto')
PB_SRCS  := $(patsubst src/rls/proto/%.proto,$(BUILD)/proto/%.pb-c.c,$(PROTOS))
PB_HDRS  := $(PB_SRCS:.c=.h)
OBJS     := $(patsubst %.c,$(BUILD)/%.o,$(notdir $(SRCS))) \
            $(patsubst src/store/scripts/%.lua,$(BUILD)/%_lua.o,$(SCRIPTS)) $(BUILD)/web_assets.o \
            $(patsubst %.c,$(BUILD)/%.o,$(notdir $(PB_SRCS)))
LIBOBJS  := $(filter-out $(BUILD)/main.o,$(OBJS))
UNIT     := $(patsubst tests/unit/%.c,$(BUILD)/tests/%,$(wildcard tests/unit/test_*.c))

# What building sluice needs; `make run` installs only these and what the demo
# runs (tests/run-demo.sh: redis-server, Debian's python3 for the echo
# upstream, curl to try it). `make test` installs the whole test toolchain.
BUILD_DEBS := build-essential pkg-config libevent-dev libhiredis-dev libyaml-dev \
            libpcre2-dev libssl-dev protobuf-c-compiler libprotobuf-c-dev libnghttp2-dev
RUN_DEBS := $(BUILD_DEBS) redis-server python3 curl
DEBS     := $(BUILD_DEBS) libcmocka-dev redis-server python3-pytest python3-requests curl
# http_parser: only test_http1_differential and fuzz_http1_differential link
# it, as the reference sluice's own HTTP/1 parser is checked against
DEBS     += libhttp-parser-dev
# ab -k: an HTTP/1.0 keep-alive client for the integration tests
DEBS     += apache2-utils
# promtool: test_metrics and the dashboard tests check /metrics scrapes and
# docs/prometheus/alerts.yml
DEBS     += prometheus
# yaml: the tests read docs/prometheus/alerts.yml
DEBS     += python3-yaml
# cryptography: tests/integration/jwtlib.py makes the JWT tests' keys and
# signs their tokens (test_jwt, test_jwt_keys)
DEBS     += python3-cryptography
# headless Chromium: test_dashboard loads the admin console's page in it
DEBS     += chromium
# TLS listeners: OpenSSL 3 (openssl CLI for the tests' certificates), and
# testssl.sh for the scanner test (test_tls_scan.py, slow)
DEBS     += openssl testssl.sh
# TLS to upstreams (nginx with ssl is the TLS upstream of test_tls_upstream) and to Redis
DEBS     += nginx
# gRPC (test_grpc.py): grpcio's server as the upstream and client; Node for
# @grpc/grpc-js and the openai client (test_cost_from) (tests/node, installed
# by npm ci from its lock file; Debian's npm only where node came without one)
DEBS     += python3-grpcio nodejs
# HTTP/2 (test_http2*, test_grpc, test_rls*): python-hyperh2 for the raw
# frames, httpx as a client, nghttp and h2load (nghttp2-client)
DEBS     += python3-h2 python3-httpx nghttp2-client
# make test-slow: wrk drives test_scale's soak, valgrind test_valgrind
DEBS     += wrk valgrind
NPM_DEB  := $(if $(shell command -v npm 2>/dev/null),,npm)

.PHONY: all deps run-deps run test test-unit test-integration test-slow clean
# Keep the generated script sources (build/NAME_lua.c) for inspection.
.SECONDARY:

all: $(BUILD)/sluice

$(BUILD)/sluice: $(OBJS) | $(BUILD)/nghttp2.ok
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# nghttp2 1.52 without Debian's security fixes takes rapid reset
# (CVE-2023-44487, +deb12u1), CONTINUATION floods (CVE-2024-28182, +deb12u2)
# and an assertion a peer can trip (CVE-2026-27135, +deb12u3) unguarded. The
# version macro still says 1.52.0, so the first two are a link test of the
# options they brought; u3 added no symbol, so on Debian the package's
# version is compared (elsewhere the link test alone decides).
NGHTTP2_MIN_DEB := 1.52.0-1+deb12u3
$(BUILD)/nghttp2.ok: | $(BUILD)
	@printf '%s\n' '#include <nghttp2/nghttp2.h>' \
	  'int main(void) { nghttp2_option *o; if (nghttp2_option_new(&o)) return 1;' \
	  '  nghttp2_option_set_stream_reset_rate_limit(o, 1000, 33);' \
	  '  nghttp2_option_set_max_continuations(o, 8); nghttp2_option_del(o); return 0; }' \
	  > $(BUILD)/nghttp2_check.c
	@$(CC) $(CFLAGS) -o $(BUILD)/nghttp2_check $(BUILD)/nghttp2_check.c $(LDLIBS) 2>/dev/null && \
	  $(BUILD)/nghttp2_check || { echo "nghttp2: the library lacks the rapid-reset and CONTINUATION" \
	  "limits (nghttp2_option_set_stream_reset_rate_limit, nghttp2_option_set_max_continuations):" \
	  "install libnghttp2-dev $(NGHTTP2_MIN_DEB) or later (Debian 12: bookworm-security)" >&2; exit 1; }
	@v=$$(dpkg-query -W -f='$${Version}' libnghttp2-14 2>/dev/null); \
	  if [ -n "$$v" ] && ! dpkg --compare-versions "$$v" ge "$(NGHTTP2_MIN_DEB)"; then \
	    echo "nghttp2: libnghttp2-14 $$v lacks the fix of CVE-2026-27135:" \
	      "install $(NGHTTP2_MIN_DEB) or later (Debian 12: bookworm-security)" >&2; exit 1; fi
	@touch $@

$(BUILD)/%.o: %.c $(SRC_HDRS) $(PB_HDRS) | $(BUILD)
	$(CC) $(CFLAGS) -c -o $@ $<

# protoc-c writes every generated file at once (the files import each other).
$(PB_SRCS) $(PB_HDRS) &: $(PROTOS) | $(BUILD)
	mkdir -p $(BUILD)/proto
	protoc-c --c_out=$(BUILD)/proto -Isrc/rls/proto $(PROTOS)

$(BUILD)/%.pb-c.o: $(PB_SRCS) $(PB_HDRS)
	$(CC) $(CFLAGS) -c -o $@ $(filter %/$*.pb-c.c,$(PB_SRCS))

# Each Redis script (src/store/scripts/NAME.lua) is embedded as the C strings
# NAME_lua and NAME_lua_sha, so EVALSHA works from the first request and
# NOSCRIPT needs only a SCRIPT LOAD.
$(BUILD)/%_lua.c: src/store/scripts/%.lua | $(BUILD)
	{ printf 'const char $*_lua_sha[] = "%s";\n' "$$(sha1sum < $< | cut -c1-40)"; \
	  printf 'const char $*_lua[] =\n'; \
	  sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/^/"/' -e 's/$$/\\n"/' $<; \
	  printf ';\n'; } > $@

$(BUILD)/%_lua.o: $(BUILD)/%_lua.c
	$(CC) $(CFLAGS) -c -o $@ $<

# The admin console's page, script and style (src/admin/web/NAME.EXT) are embedded
# as web_NAME_EXT[] and web_NAME_EXT_len: the dashboard needs no file at run
# time and loads nothing from elsewhere.
$(BUILD)/web_assets.c: $(WEB) | $(BUILD)
	{ for f in $(WEB); do n=$$(basename $$f | tr '.-' '__'); \
	    printf 'const unsigned char web_%s[] = {\n' $$n; \
	    od -An -v -tx1 $$f | sed -e 's/ \([0-9a-f][0-9a-f]\)/0x\1,/g'; \
	    printf '0};\nconst unsigned long web_%s_len = %s;\n' $$n $$(wc -c < $$f); \
	  done; } > $@

$(BUILD)/web_assets.o: $(BUILD)/web_assets.c
	$(CC) $(CFLAGS) -c -o $@ $<

# build/ can exist without build/tests (make lint's clang build makes
# build/clang first): the tests' rules ask for their own folder.
$(BUILD) $(BUILD)/tests:
	mkdir -p $@

$(BUILD)/tests/test_%: tests/unit/test_%.c tests/unit/testlib.h $(BUILD)/tests/testlib.o $(LIBOBJS) | $(BUILD)/tests
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $< $(BUILD)/tests/testlib.o $(LIBOBJS) $(LDLIBS) -lcmocka

# The differential test links the parser sluice had before (http1_ref.c, on
# http_parser): the only thing still built with -lhttp_parser.
$(BUILD)/tests/test_http1_differential: tests/unit/test_http1_differential.c tests/unit/test_http1.c \
		tests/unit/http1_diff.h tests/unit/http1_ref.h $(BUILD)/tests/http1_ref.o \
		$(BUILD)/tests/testlib.o $(LIBOBJS) | $(BUILD)/tests
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $< $(BUILD)/tests/http1_ref.o $(BUILD)/tests/testlib.o \
		$(LIBOBJS) $(LDLIBS) -lhttp_parser -lcmocka

$(BUILD)/tests/http1_ref.o: tests/unit/http1_ref.c tests/unit/http1_ref.h $(SRC_HDRS) | $(BUILD)/tests
	$(CC) $(CFLAGS) -c -o $@ $<

# What the unit tests share (a free port, a redis-server by PID)
$(BUILD)/tests/testlib.o: tests/unit/testlib.c tests/unit/testlib.h | $(BUILD)/tests
	$(CC) $(CFLAGS) -c -o $@ $<

# $(call install_missing,PACKAGES): installs only those of PACKAGES that are
# missing (dpkg -s is quick); needs root, as on CI.
define install_missing
	@missing=""; for p in $(1); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi
endef

deps:
	$(call install_missing,$(DEBS) $(NPM_DEB))
	@[ tests/node/node_modules/.package-lock.json -nt tests/node/package-lock.json ] || \
	  (cd tests/node && npm ci --no-audit --no-fund)

run-deps:
	$(call install_missing,$(RUN_DEBS))

test: deps
	$(MAKE) all
	$(MAKE) test-unit
	$(MAKE) test-integration

test-unit: $(UNIT)
	@set -e; for t in $(UNIT); do echo "== $$t"; (cd tests/unit && ../../$$t); done

test-integration: $(BUILD)/sluice
	SLUICE_BIN=$(abspath $(BUILD)/sluice) $(PYTEST) -q -m "not slow" tests/integration

# Fault, soak, scale, valgrind, Cluster and Sentinel tests, and every fuzz
# target over its seeds. Minutes, not seconds: kept out of `make test`.
test-slow: deps $(BUILD)/sluice
	SLUICE_BIN=$(abspath $(BUILD)/sluice) $(PYTEST) -q -m slow tests/integration
	$(MAKE) fuzz-smoke

# The demo's ports come from DEMO_PORT, DEMO_REDIS_PORT, DEMO_UPSTREAM_PORT and
# DEMO_ADMIN_PORT (tests/run-demo.sh), e.g. `make run DEMO_PORT=8081`.
run: run-deps all
	tests/run-demo.sh $(BUILD)/sluice conf/sluice.yaml

clean:
	rm -rf build

# Fuzz targets (libFuzzer, clang-14) live in their own fragment.
-include tests/fuzz/fuzz.mk

# The benchmark (wrk against sluice, nginx and HAProxy) lives in bench/.
-include bench/bench.mk

# Static analysis and valgrind (tests/lint.mk), the container test (docker/docker.mk).
-include tests/lint.mk
-include docker/docker.mk
