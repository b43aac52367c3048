# sluice - tests/lint.mk: static analysis and a valgrind run (included by the Makefile).
#
# `make lint` fails on any finding of cppcheck (Debian's 2.10) or clang-tidy
# (the checks in .clang-tidy), and on any warning of a clang-14 build with
# -Wall -Wextra -Werror. It installs what is missing first (the build's
# packages, then cppcheck, clang-tidy and clang-14), as `make test` does;
# .ci/run runs it before the tests. `make valgrind` runs one integration scenario
# (tests/integration/test_valgrind.py) with sluice under memcheck:
# zero errors and zero definite/indirect leaks, exit 0 after SIGTERM.

CPPCHECK    ?= cppcheck
CLANG_TIDY  ?= $(shell command -v clang-tidy-14 || command -v clang-tidy)
CLANG       ?= clang-14
LINT_JOBS   ?= $(shell nproc 2>/dev/null || echo 2)
LINT_SRCS   := $(wildcard src/*/*.c)
LINT_CFLAGS := -std=c11 -D_GNU_SOURCE $(SRC_INC) -Ibuild -Ibuild/proto $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
LINT_DEBS   := cppcheck clang-tidy clang-14

.PHONY: lint lint-deps lint-cppcheck lint-tidy lint-clang valgrind

# The checks run in a second make, after the packages are in (so that
# LINT_CFLAGS and CLANG_TIDY are read with them installed, and -j cannot
# start a check before its tool is there).
lint: lint-deps
	@$(MAKE) --no-print-directory lint-cppcheck lint-tidy lint-clang

# The Makefile's deps recipe, once for the build and once for the linters.
lint-deps: deps
	@$(MAKE) --no-print-directory deps DEBS="$(LINT_DEBS)"

lint-cppcheck:
	$(CPPCHECK) --enable=warning,performance,portability --error-exitcode=1 \
	  --inline-suppr --suppressions-list=tests/cppcheck-suppressions.txt \
	  -q $(SRC_INC) src/

# One clang-tidy per file, in parallel; WarningsAsErrors makes any finding fail.
# (rls_wire.c includes protoc-c's generated headers: made first.)
lint-tidy: $(PB_HDRS)
	@test -n "$(CLANG_TIDY)" || { echo "lint: clang-tidy not installed"; exit 1; }
	printf '%s\n' $(LINT_SRCS) | xargs -P $(LINT_JOBS) -I{} \
	  $(CLANG_TIDY) --quiet --config-file=.clang-tidy {} -- $(LINT_CFLAGS)

# A whole clang build in its own directory, so build/ (gcc) is left alone.
lint-clang:
	$(MAKE) --no-print-directory CC=$(CLANG) BUILD=build/clang build/clang/sluice

valgrind: $(BUILD)/sluice
	@command -v valgrind >/dev/null || { echo "valgrind: not installed"; exit 1; }
	SLUICE_BIN=$(abspath $(BUILD)/sluice) SLUICE_REQUIRE_VALGRIND=1 \
	  $(PYTEST) -q -m slow tests/integration/test_valgrind.py
