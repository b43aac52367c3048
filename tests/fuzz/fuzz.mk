# sluice - fuzz.mk: libFuzzer targets (clang-14, ASan + UBSan), included by
# the top-level Makefile.
#
#   make fuzz [FUZZ_SECONDS=60] [FUZZ_TARGETS="conf route_key"]
#       builds every target and runs each for FUZZ_SECONDS on a working copy
#       of its seed corpus (build/fuzz/corpus-NAME, so tests/fuzz/corpus/ is
#       not flooded); prints executions and crashes per target and a total;
#       exits non-zero on any crash (the input is kept as build/fuzz/crash-*).
#   make fuzz-smoke
#       runs each target once over its seeds only (-runs=0): seconds, for
#       `make test`.
#   FUZZ_EXTRA="-D..." adds flags to every fuzz compile (with its own
#       FUZZ_DIR=...), e.g. to leave a known, reported bug out of a harness
#       while a long run looks for others.

FUZZ_CC       ?= clang-14
FUZZ_SECONDS  ?= 60
FUZZ_DIR      := build/fuzz
FUZZ_ALL      := http1_request http1_response conf route_normalize route_key \
                 h1write_request h1write_response http1_differential redis_reply admin_api \
                 fwdauth rls h2srv jwt jsonscan
FUZZ_TARGETS  ?= $(FUZZ_ALL)
FUZZ_SAN      := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
FUZZ_BASE     := -g -O1 -std=c11 -D_GNU_SOURCE $(SRC_INC) -Ibuild/proto $(FUZZ_SAN) $(FUZZ_EXTRA) \
                 $(shell pkg-config --cflags yaml-0.1 2>/dev/null)
# Our harnesses are held to the house warnings; src/ is built by gcc with
# -Werror already, so clang's extra opinions on it do not stop a fuzz run.
FUZZ_HFLAGS   := $(FUZZ_BASE) -Wall -Wextra -Werror -Wshadow -Wno-unused-parameter
# conf*.o parse only (TLS files and contexts are confcheck.o's); libcrypto
# is route.o's SHA-1 of long key parts. http_parser only for
# http1_differential's reference (tests/unit/http1_ref.c).
FUZZ_LIBS     := -lhttp_parser $(shell pkg-config --libs yaml-0.1 libevent libpcre2-8 libcrypto 2>/dev/null) -lpthread -lm
# rconn.o (the Redis reply reader) brings hiredis and OpenSSL.
FUZZ_LIBS_redis_reply := -lhiredis $(shell pkg-config --libs libevent_openssl openssl 2>/dev/null)
FUZZ_LIBS_admin_api   := $(FUZZ_LIBS_redis_reply)
FUZZ_LIBS_rls         := -lprotobuf-c
# the HTTP/2 session: nghttp2, and io.o's OpenSSL
FUZZ_LIBS_h2srv       := $(shell pkg-config --libs libnghttp2 openssl 2>/dev/null)
FUZZ_DEBS     := clang-14 libfuzzer-14-dev llvm-14

# The src/ modules each target links, and its longest input.
FUZZ_OBJS_http1_request   := http1 mem
FUZZ_OBJS_http1_response  := http1 mem
FUZZ_OBJS_conf            := conf conf_value conf_tls conf_net conf_redis conf_limits conf_jwt conf_rls conf_load addr limiter tzcal regex esc jsonscan mem
FUZZ_OBJS_route_normalize := route jwt digest addr conf conf_value conf_tls conf_net conf_redis conf_limits conf_jwt conf_rls conf_load limiter tzcal regex esc jsonscan http1 mem
FUZZ_OBJS_route_key       := route jwt digest addr conf conf_value conf_tls conf_net conf_redis conf_limits conf_jwt conf_rls conf_load limiter tzcal regex esc jsonscan http1 mem
FUZZ_OBJS_h1write_request := h1write http1 mem
FUZZ_OBJS_h1write_response := h1write http1 mem
FUZZ_OBJS_http1_differential := http1 http1_ref mem
FUZZ_OBJS_redis_reply     := rconn store_util tls_client log mem
FUZZ_OBJS_jsonscan        := jsonscan
FUZZ_OBJS_admin_api       := admin_api rls_match digest memstore kvtable list limiter tzcal route jwt addr regex http1 esc \
                             conf conf_value conf_tls conf_net conf_redis conf_limits conf_jwt conf_rls conf_load jsonscan \
                             resetbus plantable loopthread store_sync store_sub store_util rconn tls_client \
                             metrics log mem
FUZZ_OBJS_rls             := rls_wire rls_match digest mem conf conf_value conf_tls conf_net \
                             conf_redis conf_limits conf_jwt conf_rls conf_load addr limiter tzcal regex esc jsonscan \
                             rls.pb-c ratelimit.pb-c base.pb-c duration.pb-c wrappers.pb-c \
                             ratelimit_unit.pb-c
FUZZ_OBJS_h2srv           := h2srv h2msg http1 io list log mem
FUZZ_LEN_http1_request    := 8192
FUZZ_LEN_http1_response   := 8192
FUZZ_LEN_conf             := 8192
FUZZ_LEN_route_normalize  := 4096
FUZZ_LEN_route_key        := 4096
FUZZ_LEN_h1write_request  := 8192
FUZZ_LEN_h1write_response := 8192
FUZZ_LEN_http1_differential := 8192
FUZZ_LEN_redis_reply      := 8192
FUZZ_LEN_admin_api        := 8192
FUZZ_LEN_h2srv            := 16384
FUZZ_OBJS_jwt             := jwt mem
FUZZ_LEN_jwt              := 9000
FUZZ_OBJS_fwdauth         := fwdauth $(FUZZ_OBJS_route_key)
FUZZ_LEN_fwdauth          := 4096
FUZZ_DICT_fwdauth         := tests/fuzz/route.dict
FUZZ_LEN_rls              := 4096
FUZZ_LEN_jsonscan         := 8192
FUZZ_DICT_http1_request   := tests/fuzz/http1.dict
FUZZ_DICT_http1_response  := tests/fuzz/http1.dict
FUZZ_DICT_conf            := tests/fuzz/conf.dict
FUZZ_DICT_route_normalize := tests/fuzz/route.dict
FUZZ_DICT_route_key       := tests/fuzz/route.dict
FUZZ_DICT_h1write_request := tests/fuzz/http1.dict
FUZZ_DICT_h1write_response := tests/fuzz/http1.dict
FUZZ_DICT_http1_differential := tests/fuzz/http1.dict
FUZZ_DICT_redis_reply     := tests/fuzz/resp.dict
FUZZ_DICT_admin_api       := tests/fuzz/admin_api.dict
FUZZ_DICT_rls             := tests/fuzz/rls.dict
FUZZ_DICT_h2srv           := tests/fuzz/h2srv.dict
FUZZ_DICT_jwt             := tests/fuzz/jwt.dict
FUZZ_DICT_jsonscan        := tests/fuzz/jsonscan.dict

FUZZ_BINS := $(patsubst %,$(FUZZ_DIR)/fuzz_%,$(FUZZ_TARGETS))

.PHONY: fuzz fuzz-build fuzz-smoke fuzz-deps
.PRECIOUS: $(FUZZ_DIR)/obj/%.o $(FUZZ_DIR)/harness_%.o

fuzz-deps:
	@missing=""; for p in $(FUZZ_DEBS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi

fuzz-build: fuzz-deps
	@$(MAKE) --no-print-directory $(FUZZ_BINS)

$(FUZZ_DIR)/obj/%.o: %.c $(SRC_HDRS)
	@mkdir -p $(FUZZ_DIR)/obj
	$(FUZZ_CC) $(FUZZ_BASE) -fsanitize=fuzzer-no-link -w -c -o $@ $<

# protoc-c's code for the RLS messages (the Makefile's rule writes it into
# build/proto).
$(FUZZ_DIR)/obj/%.pb-c.o: $(PB_SRCS) $(PB_HDRS)
	@mkdir -p $(FUZZ_DIR)/obj
	$(FUZZ_CC) $(FUZZ_BASE) -fsanitize=fuzzer-no-link -w -c -o $@ $(filter %/$*.pb-c.c,$(PB_SRCS))

# The reference parser lives with the unit tests, outside src/.
$(FUZZ_DIR)/obj/http1_ref.o: tests/unit/http1_ref.c tests/unit/http1_ref.h $(SRC_HDRS)
	@mkdir -p $(FUZZ_DIR)/obj
	$(FUZZ_CC) $(FUZZ_BASE) -fsanitize=fuzzer-no-link -w -c -o $@ $<

$(FUZZ_DIR)/harness_%.o: tests/fuzz/fuzz_%.c tests/fuzz/*.h tests/unit/http1_diff.h $(SRC_HDRS) $(PB_HDRS)
	@mkdir -p $(FUZZ_DIR)
	$(FUZZ_CC) $(FUZZ_HFLAGS) -fsanitize=fuzzer-no-link -c -o $@ $<

.SECONDEXPANSION:
# (addprefix, not patsubst: a '%' here would be taken for the stem.)
$(FUZZ_DIR)/fuzz_%: $(FUZZ_DIR)/harness_%.o $$(addprefix $(FUZZ_DIR)/obj/,$$(addsuffix .o,$$(FUZZ_OBJS_$$*)))
	$(FUZZ_CC) $(FUZZ_SAN) -fsanitize=fuzzer -o $@ $^ $(FUZZ_LIBS) $(FUZZ_LIBS_$*)

# One shell per target run; the log's final stats give the executions.
fuzz: fuzz-build
	@total=0; crashed=0; \
	for t in $(FUZZ_TARGETS); do \
	  case $$t in \
	    http1_request) len=$(FUZZ_LEN_http1_request); dict=$(FUZZ_DICT_http1_request);; \
	    http1_response) len=$(FUZZ_LEN_http1_response); dict=$(FUZZ_DICT_http1_response);; \
	    conf) len=$(FUZZ_LEN_conf); dict=$(FUZZ_DICT_conf);; \
	    route_normalize) len=$(FUZZ_LEN_route_normalize); dict=$(FUZZ_DICT_route_normalize);; \
	    route_key) len=$(FUZZ_LEN_route_key); dict=$(FUZZ_DICT_route_key);; \
	    h1write_request) len=$(FUZZ_LEN_h1write_request); dict=$(FUZZ_DICT_h1write_request);; \
	    h1write_response) len=$(FUZZ_LEN_h1write_response); dict=$(FUZZ_DICT_h1write_response);; \
	    http1_differential) len=$(FUZZ_LEN_http1_differential); dict=$(FUZZ_DICT_http1_differential);; \
	    redis_reply) len=$(FUZZ_LEN_redis_reply); dict=$(FUZZ_DICT_redis_reply);; \
	    admin_api) len=$(FUZZ_LEN_admin_api); dict=$(FUZZ_DICT_admin_api);; \
	    rls) len=$(FUZZ_LEN_rls); dict=$(FUZZ_DICT_rls);; \
	    h2srv) len=$(FUZZ_LEN_h2srv); dict=$(FUZZ_DICT_h2srv);; \
	    jwt) len=$(FUZZ_LEN_jwt); dict=$(FUZZ_DICT_jwt);; \
	    fwdauth) len=$(FUZZ_LEN_fwdauth); dict=$(FUZZ_DICT_fwdauth);; \
	    jsonscan) len=$(FUZZ_LEN_jsonscan); dict=$(FUZZ_DICT_jsonscan);; \
	  esac; \
	  work=$(FUZZ_DIR)/corpus-$$t; mkdir -p $$work; cp -n tests/fuzz/corpus/$$t/* $$work/; \
	  log=$(FUZZ_DIR)/$$t.log; \
	  if $(FUZZ_DIR)/fuzz_$$t -max_total_time=$(FUZZ_SECONDS) -max_len=$$len -timeout=10 \
	       -dict=$$dict -print_final_stats=1 -artifact_prefix=$(FUZZ_DIR)/crash-$$t- \
	       $$work > $$log 2>&1; then status=ok; \
	  else status="CRASH (see $$log, input $(FUZZ_DIR)/crash-$$t-*)"; crashed=$$((crashed + 1)); fi; \
	  n=$$(sed -n 's/^stat::number_of_executed_units: *//p' $$log | tail -1); \
	  [ -n "$$n" ] || n=$$(sed -n 's/^#\([0-9]*\).*/\1/p' $$log | tail -1); \
	  n=$${n:-0}; total=$$((total + n)); \
	  echo "fuzz: $$t: $$n executions in $(FUZZ_SECONDS)s, $$status"; \
	done; \
	echo "fuzz: total: $$total executions, $$crashed target(s) crashed"; \
	[ $$crashed -eq 0 ]

fuzz-smoke: fuzz-build
	@set -e; for t in $(FUZZ_TARGETS); do \
	  if $(FUZZ_DIR)/fuzz_$$t -runs=0 tests/fuzz/corpus/$$t > $(FUZZ_DIR)/$$t.smoke.log 2>&1; then \
	    echo "fuzz-smoke: $$t: $$(ls tests/fuzz/corpus/$$t | wc -l) seeds ok"; \
	  else echo "fuzz-smoke: $$t: FAILED (see $(FUZZ_DIR)/$$t.smoke.log)"; exit 1; fi; \
	done
