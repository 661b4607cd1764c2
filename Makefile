# kiln - build, test, demo. `make` builds build/libkiln.{a,so} and build/kiln;
# `make test` runs the whole suite; `make demo` runs the pipeline end to end.
# Missing Debian packages are installed with apt-get on first use (root).

BUILD ?= build
SAN ?=
CC ?= cc
PKGS := libsodium jansson sqlite3 libarchive libzstd libmicrohttpd libcurl libcrypto
# OpenBLAS is no library dependency: kiln's GEMM is its own (kernels/cpu/gemm.c, so the bits do
# not follow the BLAS kernel a host picks; docs/runtime.md). It stays the baseline the
# benchmarks measure kiln's GEMM against (bench_train, bench_stream).
BLAS_PKG := openblas
# Debian packages that provide the pkg-config names above, and the tools the tests use
# (TOOLS: probed by name; minisign checks interoperability of kiln's signatures, curl fetches
# the registry's web page in tests/e2e/62-web.sh, openssl makes the test CA of 68-tls.sh).
DEB_PKGS := pkg-config libsodium-dev libjansson-dev libsqlite3-dev libopenblas-dev sqlite3 \
            libarchive-dev libzstd-dev minisign libmicrohttpd-dev libcurl4-openssl-dev \
            libopenmpi-dev openmpi-bin libssl-dev curl openssl slurm-wlm munge \
            libcsv-dev
TOOLS := sqlite3 minisign mpirun curl openssl sbatch slurmctld slurmd munged
# slurm-wlm and munge: tests/e2e/52-sweep.sh starts a single-node Slurm cluster of its own
# (tests/slurm/cluster.sh) to run kiln sweep on; kiln itself only runs sbatch, squeue,
# scontrol and srun as commands.
# The Python package (python/kiln, tests/python) and the model's float64 reference (tests/ref):
# Debian's interpreter and its numpy and torch (kiln.torch); the bindings' tests also use pandas,
# and pip, setuptools and venv (pip install ./python into a virtual environment). Probed by
# importing them with /usr/bin/python3; setuptools first: imported after torch, its distutils
# hack fails.
PY_DEB_PKGS := python3 python3-numpy python3-torch python3-pandas python3-pip python3-setuptools \
               python3-venv
DEB_PKGS += $(PY_DEB_PKGS)
PY_PROBE := /usr/bin/python3 -c 'import setuptools, pip, ensurepip, numpy, pandas, torch'
# kiln on OCI registries (tests/e2e/72-74, make demo-oci): Debian's docker-registry (CNCF
# distribution) started on loopback by the tests, skopeo to copy between registries and log
# in, htpasswd (apache2-utils) for the basic-auth registry.
DEB_PKGS += docker-registry skopeo apache2-utils
TOOLS += docker-registry skopeo htpasswd
# Headless Chromium loads the runs and registry web pages in the tests (tests/e2e/browser.sh).
DEB_PKGS += chromium
TOOLS += chromium
# Open MPI is not in PKGS: only build/libkiln_dist.a uses it, for its headers; libmpi is
# opened by `mpirun ... kiln train` (train/comm_mpi.c), so no binary links it.
MPI_PKG := ompi-c
# `make fuzz` only: clang with libFuzzer. Each target runs FUZZ_SECONDS.
FUZZ_DEB_PKGS := clang libclang-rt-14-dev
# `make bench-registry` only: the baselines its figures are measured against.
BENCH_DEB_PKGS := nginx-light curl
# `make soak` only: curl sends the registry soak's bad requests.
SOAK_DEB_PKGS := curl
FUZZ_CC ?= clang
FUZZ_SECONDS ?= 60

NVCC ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
ifneq ($(SAN)$(FUZZ),)
NVCC :=
endif
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
NCCL_H := $(if $(NVCC),$(wildcard $(CUDA_HOME)/include/nccl.h))

GIT_REV := $(shell git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
MODULES := core kernels kernels/cpu train runs runtime export validate sign registry web sweep release data
# registry/'s sides (docs/registry.md): each a module of the layering check.
MODULES += registry/common registry/server registry/client
INCLUDES := -Iinclude $(addprefix -I,$(wildcard $(MODULES)))

PKG_CFLAGS = $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS = $(shell pkg-config --libs $(PKGS) 2>/dev/null)
BLAS_CFLAGS = $(shell pkg-config --cflags $(BLAS_PKG) 2>/dev/null)
BLAS_LIBS = $(shell pkg-config --libs $(BLAS_PKG) 2>/dev/null)
MPI_CFLAGS = $(shell pkg-config --cflags $(MPI_PKG) 2>/dev/null)

CFLAGS := -std=c11 -D_GNU_SOURCE -O2 -g -Wall -Wextra -Werror -Wno-unused-parameter \
          -fPIC -fvisibility=hidden -pthread
LDLIBS := -lm -pthread -ldl
# libcsv (CSV import, data/csv.c) has no pkg-config file: probed by its header below.
LDLIBS += -lcsv

ifneq ($(SAN),)
CFLAGS += -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
LDFLAGS += -fsanitize=address,undefined
endif
# The libFuzzer build (make fuzz): instrumented for coverage and ASan+UBSan; clang's
# warnings are not gcc's, so they do not stop it.
ifneq ($(FUZZ),)
CFLAGS += -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer \
          -Wno-error
LDFLAGS += -fsanitize=address,undefined
endif

# Data parallelism's transports (MPI; NCCL where nvcc and nccl.h are): libkiln_dist.a.
DIST_SRC := train/comm_mpi.c $(if $(NCCL_H),train/comm_nccl.c train/nccl_dl.c)
# kernels/cuda/*.c: host code against the toolkit's headers (cuBLAS opened on first use).
LIB_SRC := $(filter-out train/comm_mpi.c train/comm_nccl.c train/nccl_dl.c, \
             $(sort $(wildcard core/*.c kernels/cpu/*.c kernels/*.c train/*.c runs/*.c runtime/*.c export/*.c \
                              validate/*.c sign/*.c registry/*.c web/*.c sweep/*.c release/*.c data/*.c) \
                    $(if $(NVCC),$(wildcard kernels/cuda/*.c))))
LIB_SRC += $(sort $(wildcard registry/*/*.c))
CLI_SRC := $(sort $(wildcard cli/*.c))
# tests/fuzz/NAME.c defines the entry point kiln_fuzz_NAME for tests/fuzz/corpus/NAME/;
# the C suite replays every corpus through them (tests/test_fuzz_replay.c).
FUZZ_SRC := $(sort $(wildcard tests/fuzz/*.c))
FUZZ_TARGETS := $(basename $(notdir $(FUZZ_SRC)))
TEST_SRC := $(sort $(wildcard tests/*.c)) $(FUZZ_SRC)
CU_SRC := $(if $(NVCC),$(sort $(wildcard kernels/cuda/*.cu)))

ifneq ($(CU_SRC),)
CFLAGS += -DKILN_HAVE_CUDA
# The CUDA runtime is linked statically (it opens the driver, libcuda, when a GPU is first
# asked for) and cuBLAS and NCCL are opened on first use (kernels/cuda/blas_dl.c,
# train/nccl_dl.c; the rpath is where they are looked for): so kiln and libkiln start in
# milliseconds, not the 80-100 ms and 200 MB that mapping cuBLAS cost every process, and run
# on machines without the CUDA libraries. nvcc's host code needs the C++ runtime.
CU_LIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart_static -lrt -lstdc++
# Hopper natively, PTX for newer chips, Ampere as the generic target.
NVCC_ARCH ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
             -gencode arch=compute_90,code=compute_90
NVCC_FLAGS := -O2 -std=c++17 $(NVCC_ARCH) -Werror all-warnings -DKILN_HAVE_CUDA \
              -Xcompiler -fPIC,-fvisibility=hidden,-Wall,-Wextra,-Werror,-Wno-unused-parameter
endif

LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/obj/%.o) $(CU_SRC:%.cu=$(BUILD)/obj/%.cu.o)
DIST_OBJ := $(DIST_SRC:%.c=$(BUILD)/obj/%.o)
comma := ,
$(DIST_OBJ): PKG_CFLAGS += $(MPI_CFLAGS) $(if $(NCCL_H),-DKILN_HAVE_NCCL -isystem $(CUDA_HOME)/include)
$(BUILD)/obj/kernels/cuda/%.o: PKG_CFLAGS += -isystem $(CUDA_HOME)/include
CLI_OBJ := $(CLI_SRC:%.c=$(BUILD)/obj/%.o)
TEST_OBJ := $(TEST_SRC:%.c=$(BUILD)/obj/%.o)
ALL_LIBS = $(PKG_LIBS) $(CU_LIBS) $(LDLIBS)

DEPS_STAMP := $(BUILD)/.deps-ok

.PHONY: FORCE all deps test test-c test-e2e test-asan demo demo-oci clean bench bench-registry bench-web fuzz soak
# With nvcc, the GPU checker (tests/gpu/check.c) too: every CUDA path compiles in CI, which has
# no GPU to run it on.
all: $(BUILD)/libkiln.a $(BUILD)/libkiln.so $(BUILD)/libkiln_dist.a $(BUILD)/kiln $(BUILD)/run-tests \
     $(BUILD)/stream_service $(if $(CU_SRC),$(BUILD)/gpu-check)

# Install what is missing, once per build directory. pkg-config answers for the
# libraries; the tools are probed by name.
deps: $(DEPS_STAMP)
$(DEPS_STAMP):
	@mkdir -p $(BUILD)
	@missing=; for t in pkg-config $(TOOLS); do command -v $$t >/dev/null || missing=1; done; \
	echo '#include <csv.h>' | $(CC) -E - >/dev/null 2>&1 || missing=1; \
	$(PY_PROBE) >/dev/null 2>&1 || missing=1; \
	if [ -n "$$missing" ] || ! pkg-config --exists $(PKGS) $(BLAS_PKG) $(MPI_PKG); then \
	  echo "kiln: installing build dependencies: $(DEB_PKGS)"; \
	  if [ "$$(id -u)" != 0 ]; then echo "kiln: missing packages and not root; install: $(DEB_PKGS)" >&2; exit 2; fi; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get update -qq && apt-get install -y -qq --no-install-recommends $(DEB_PKGS) >/dev/null || exit 2; \
	fi
	@touch $@

# The test vectors (tests/vectors/tsmoe-*) from the float64 reference of docs/model.md;
# `make test` recomputes them and fails where the committed files disagree with what it computes.
# SHARED_VECTORS: an independently made set, checked against the same reference only when it is
# there (an optional agreement check: a clone with nothing beside it builds and tests without it).
REF := /usr/bin/python3 tests/ref/tsmoe_ref.py
SHARED_VECTORS ?= ../shared/vectors
.PHONY: vectors
vectors: $(DEPS_STAMP)
	$(REF) tests/vectors

$(BUILD)/obj/%.o: %.c | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	@echo "  CC      $<"
	@$(CC) $(CFLAGS) $(INCLUDES) $(PKG_CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/obj/%.cu.o: %.cu | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	@echo "  NVCC    $<"
	@$(NVCC) $(NVCC_FLAGS) $(INCLUDES) -MMD -MP -c $< -o $@

$(BUILD)/libkiln.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

# libkiln.so exports what include/kiln.h declares (KILN_API) and nothing else: a version
# script made from the header's declarations (tests/e2e/05-exports.sh checks the result). The
# CLI and the tests link the static library, which keeps every symbol.
$(BUILD)/libkiln.map: include/kiln.h
	@mkdir -p $(BUILD)
	@{ echo '{ global:'; grep -o 'KILN_API[^(]*(' $< | grep -v __attribute__ | \
	   sed 's/ *($$//; s/.*[ *]//; s/$$/;/'; echo 'local: *; };'; } > $@.tmp && mv $@.tmp $@

# The shared library's version from KILN_VERSION (include/kiln.h): libkiln.so.MAJOR.MINOR,
# soname libkiln.so.MAJOR (a new MAJOR is a new ABI).
KILN_VER := $(shell sed -n 's/^\#define KILN_VERSION "\(.*\)"/\1/p' include/kiln.h)
SO_MAJOR := $(word 1,$(subst ., ,$(KILN_VER)))
SO_MINOR := $(word 2,$(subst ., ,$(KILN_VER)))
$(BUILD)/libkiln.so: $(LIB_OBJ) $(BUILD)/libkiln.map
	$(CC) -shared $(LDFLAGS) -Wl,-soname,libkiln.so.$(SO_MAJOR) \
	  -Wl,--version-script=$(BUILD)/libkiln.map -o $@ $(LIB_OBJ) $(ALL_LIBS)

$(BUILD)/libkiln_dist.a: $(DIST_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/kiln: $(CLI_OBJ) $(BUILD)/libkiln_dist.a $(BUILD)/libkiln.a
	$(CC) $(LDFLAGS) -o $@ $(CLI_OBJ) $(BUILD)/libkiln_dist.a $(BUILD)/libkiln.a $(ALL_LIBS)

# The test table is generated from the KILN_TEST(name) definitions in tests/*.c.
# Generated tables are remade on every run but only replaced when their text changes, so
# a removed file drops out of them and an unchanged tree rebuilds nothing.
$(BUILD)/tests.inc: FORCE
	@mkdir -p $(BUILD)
	@grep -ho '^KILN_TEST([a-z0-9_]*)' $(TEST_SRC) | sed 's/KILN_TEST(\(.*\))/T(\1)/' > $@.tmp
	@cmp -s $@.tmp $@ && rm -f $@.tmp || mv $@.tmp $@

# The revision kiln_version() reports, as a generated header only core/err.c includes: remade
# on every run, replaced only when HEAD moved, so err.o (and what links it) is rebuilt then and
# only then. (A -D flag on every object went stale: make does not see a flag change.)
$(BUILD)/kiln_rev.h: FORCE
	@mkdir -p $(BUILD)
	@printf '#define KILN_GIT_REV "%s"\n' '$(GIT_REV)' > $@.tmp
	@cmp -s $@.tmp $@ && rm -f $@.tmp || mv $@.tmp $@
$(BUILD)/obj/core/err.o: $(BUILD)/kiln_rev.h
$(BUILD)/obj/core/err.o: INCLUDES += -I$(BUILD)

# The CPU kernels are the trainer's inner loops: -O3 vectorises their fixed-order loops.
$(BUILD)/obj/kernels/cpu/%.o: CFLAGS += -O3

$(BUILD)/obj/tests/run.o: $(BUILD)/tests.inc

# The fuzz replay test calls every entry point through a table made from the file names.
$(BUILD)/fuzz-targets.inc: FORCE
	@mkdir -p $(BUILD)
	@printf 'F(%s)\n' $(FUZZ_TARGETS) > $@.tmp
	@cmp -s $@.tmp $@ && rm -f $@.tmp || mv $@.tmp $@
$(BUILD)/obj/tests/test_fuzz_replay.o: $(BUILD)/fuzz-targets.inc
$(BUILD)/obj/tests/%.o: INCLUDES += -I$(BUILD)

# Where NCCL is, the suite also checks its loader (train/nccl_dl.o, from libkiln_dist.a; no
# test calls MPI through it, so no libmpi is linked).
$(BUILD)/obj/tests/test_cuda.o: CFLAGS += $(if $(NCCL_H),-DKILN_HAVE_NCCL)
$(BUILD)/run-tests: $(TEST_OBJ) $(BUILD)/libkiln.a $(if $(NCCL_H),$(BUILD)/libkiln_dist.a)
	$(CC) $(LDFLAGS) -o $@ $(TEST_OBJ) $(if $(NCCL_H),$(BUILD)/libkiln_dist.a) $(BUILD)/libkiln.a \
	  $(ALL_LIBS)

# The example a service copies: built against the public header and the static library only.
$(BUILD)/stream_service: examples/stream_service.c include/kiln.h $(BUILD)/libkiln.a
	$(CC) $(CFLAGS) -Iinclude -o $@ examples/stream_service.c $(BUILD)/libkiln.a $(ALL_LIBS)

# Streaming latency against an OpenBLAS sgemv baseline measured in the same run.
$(BUILD)/obj/bench/bench_stream.o $(BUILD)/obj/bench/bench_train.o: PKG_CFLAGS += $(BLAS_CFLAGS)
$(BUILD)/bench_stream: $(BUILD)/obj/bench/bench_stream.o $(BUILD)/libkiln.a
	$(CC) $(LDFLAGS) -o $@ $< $(BUILD)/libkiln.a $(BLAS_LIBS) $(ALL_LIBS)

# CPU training throughput against an OpenBLAS sgemm baseline measured in the same run.
$(BUILD)/bench_train: $(BUILD)/obj/bench/bench_train.o $(BUILD)/libkiln.a
	$(CC) $(LDFLAGS) -o $@ $< $(BUILD)/libkiln.a $(BLAS_LIBS) $(ALL_LIBS)

# The registry's web page (200 versions, 1000 channel records) against the JSON API's answers
# with the same rows, in the same run.
$(BUILD)/bench_web: $(BUILD)/obj/bench/bench_web.o $(BUILD)/libkiln.a
	$(CC) $(LDFLAGS) -o $@ $< $(BUILD)/libkiln.a $(ALL_LIBS)

# What the trainer's metrics logging costs a step (kiln_run_metrics_step, runs/metrics.c).
$(BUILD)/bench_metrics_log: $(BUILD)/obj/bench/bench_metrics_log.o $(BUILD)/libkiln.a
	$(CC) $(LDFLAGS) -o $@ $< $(BUILD)/libkiln.a $(ALL_LIBS)

# What a model swap costs a service's tick path (bench_registry.sh runs it).
$(BUILD)/bench_watch: $(BUILD)/obj/bench/bench_watch.o $(BUILD)/libkiln.a
	$(CC) $(LDFLAGS) -o $@ $< $(BUILD)/libkiln.a $(ALL_LIBS)

# A registry token's cost per request, and what writing last_used once a minute saves over
# writing it on every request (docs/registry.md, "Last used").
.PHONY: bench-tokens
$(BUILD)/bench_tokens: $(BUILD)/obj/bench/bench_tokens.o $(BUILD)/libkiln.a
	$(CC) $(LDFLAGS) -o $@ $< $(BUILD)/libkiln.a $(ALL_LIBS)

bench-tokens: $(BUILD)/bench_tokens
	@rm -rf $(BUILD)/bench/tokens-store && mkdir -p $(BUILD)/bench
	$(BUILD)/bench_tokens $(BUILD)/bench/tokens-store
	@rm -rf $(BUILD)/bench/tokens-store

# /metrics on a store of 1000 channels (their expiry gauges) against /healthz in the same run.
.PHONY: bench-metrics
bench-metrics: $(BUILD)/kiln
	bench/bench_metrics.sh $(BUILD)/kiln

# kiln registry audit on a million-entry log against sqlite3 on the same file.
.PHONY: bench-audit
bench-audit: $(BUILD)/kiln
	@mkdir -p $(BUILD)/bench
	sh bench/bench_audit.sh $(BUILD)/kiln | tee $(BUILD)/bench/audit.txt

bench-web: $(BUILD)/bench_web
	@mkdir -p $(BUILD)/bench
	$(BUILD)/bench_web $(BUILD)/bench > $(BUILD)/bench/web.txt.tmp && mv $(BUILD)/bench/web.txt.tmp $(BUILD)/bench/web.txt
	@cat $(BUILD)/bench/web.txt

# kiln runs serve's run page for a run of a million generated steps against one of a thousand
# and against sqlite3 reading the same series (bench/bench_runs_web.sh; ~750 MB kept in
# $(BUILD)/bench/runs-web).
.PHONY: bench-runs-web
bench-runs-web: $(BUILD)/kiln $(BUILD)/bench_metrics_log
	@mkdir -p $(BUILD)/bench
	sh bench/bench_runs_web.sh $(BUILD)/kiln $(BUILD)/bench > $(BUILD)/bench/runs_web.txt.tmp && mv $(BUILD)/bench/runs_web.txt.tmp $(BUILD)/bench/runs_web.txt
	@cat $(BUILD)/bench/runs_web.txt

bench: $(BUILD)/bench_stream $(BUILD)/bench_train $(BUILD)/bench_web
	@mkdir -p $(BUILD)/bench
	$(BUILD)/bench_stream $(BUILD)/bench > $(BUILD)/bench/stream.txt.tmp && mv $(BUILD)/bench/stream.txt.tmp $(BUILD)/bench/stream.txt
	@cat $(BUILD)/bench/stream.txt
	$(BUILD)/bench_train > $(BUILD)/bench/train.txt.tmp && mv $(BUILD)/bench/train.txt.tmp $(BUILD)/bench/train.txt
	@cat $(BUILD)/bench/train.txt
	@$(MAKE) --no-print-directory bench-web
	@$(MAKE) --no-print-directory bench-python
	@$(MAKE) --no-print-directory bench-runs-web
	@$(MAKE) --no-print-directory bench-registry

# Pull and verify of a ~1 GiB archive over loopback against curl from nginx-light and
# b2sum/sha256sum in the same run (bench/bench_registry.sh; about 5 GiB of /tmp while it runs).
bench-registry: $(BUILD)/kiln $(BUILD)/bench_watch
	@if ! command -v nginx >/dev/null && [ ! -x /usr/sbin/nginx ] || ! command -v curl >/dev/null; then \
	  echo "kiln: installing benchmark dependencies: $(BENCH_DEB_PKGS)"; \
	  if [ "$$(id -u)" != 0 ]; then echo "kiln: not root; install: $(BENCH_DEB_PKGS)" >&2; exit 2; fi; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get update -qq && apt-get install -y -qq --no-install-recommends $(BENCH_DEB_PKGS) >/dev/null || exit 2; \
	fi
	@mkdir -p $(BUILD)/bench
	bench/bench_registry.sh $(BUILD) $(BUILD)/bench/registry.txt.tmp && mv $(BUILD)/bench/registry.txt.tmp $(BUILD)/bench/registry.txt
	@cat $(BUILD)/bench/registry.txt

# The benchmarks are built (not run) by make test, so that none of them rots unnoticed.
BENCH_BINS := $(addprefix $(BUILD)/,bench_stream bench_train bench_web bench_tokens bench_watch)
BENCH_BINS += $(BUILD)/bench_metrics_log

# The Python bindings against C on the same model and rows (bench/bench_python.py, with
# bench_push: kiln_stream_push and kiln_model_forward through kiln.h only).
.PHONY: bench-python
BENCH_BINS += $(BUILD)/bench_push
$(BUILD)/bench_push: $(BUILD)/obj/bench/bench_push.o $(BUILD)/libkiln.a
	$(CC) $(LDFLAGS) -o $@ $< $(BUILD)/libkiln.a $(ALL_LIBS)

bench-python: $(BUILD)/kiln $(BUILD)/libkiln.so $(BUILD)/bench_push
	@mkdir -p $(BUILD)/bench
	KILN_LIB=$(abspath $(BUILD)/libkiln.so) /usr/bin/python3 bench/bench_python.py $(BUILD) > $(BUILD)/bench/python.txt.tmp && mv $(BUILD)/bench/python.txt.tmp $(BUILD)/bench/python.txt
	@cat $(BUILD)/bench/python.txt

# The sanitizer build inside make test compiles on every core even when make test was started
# without -j (as CI and the README run it), instead of one file at a time on one core of
# two. Under a -j of the caller's, the jobserver already shares the cores.
SUBMAKE_JOBS = $(if $(findstring jobserver,$(MAKEFLAGS)),,-j$(shell nproc 2>/dev/null || echo 2))

test: all $(BENCH_BINS)
	@echo "== the reference vectors (tests/ref) against docs/model.md's float64 reference"
	$(REF) --check tests/vectors
	@echo "== the same under OpenBLAS's Haswell kernel, as AMD Zen hosts run (numpy's BLAS; kiln links none: tests/e2e/12-same-bits.sh)"
	@for c in Haswell; do echo "OPENBLAS_CORETYPE=$$c"; \
	  OPENBLAS_CORETYPE=$$c $(REF) --check tests/vectors >$(BUILD)/vectors-$$c.log 2>&1 || \
	  { cat $(BUILD)/vectors-$$c.log; exit 1; }; done
	@if [ -f $(SHARED_VECTORS)/tsmoe-moe.io.safetensors ]; then \
	  echo "== the reference against the independent vectors in $(SHARED_VECTORS)"; \
	  $(REF) --check $(SHARED_VECTORS); fi
	@echo "== C suite"
	KILN_BUILD=$(BUILD) $(BUILD)/run-tests
	@echo "== end-to-end"
	KILN=$(abspath $(BUILD)/kiln) KILN_E2E_SKIP=70-bad-input.sh tests/e2e/run-all
	@echo "== make demo (the README's walk, end to end; its output in $(BUILD)/demo.log)"
	@KILN=$(abspath $(BUILD)/kiln) examples/demo.sh >$(BUILD)/demo.log 2>&1 || \
	  { tail -n 30 $(BUILD)/demo.log; echo "FAIL make demo: see $(BUILD)/demo.log"; exit 1; }
	@echo "demo passed"
	@echo "== Python (python/kiln over $(BUILD)/libkiln.so)"
	KILN=$(abspath $(BUILD)/kiln) KILN_LIB=$(abspath $(BUILD)/libkiln.so) /usr/bin/python3 tests/python/run.py
	@echo "== C suite under AddressSanitizer and UndefinedBehaviorSanitizer, in a shuffled order"
	$(MAKE) --no-print-directory $(SUBMAKE_JOBS) BUILD=$(BUILD)/asan SAN=1 $(BUILD)/asan/run-tests $(BUILD)/asan/kiln
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 \
	  KILN_BUILD=$(BUILD)/asan KILN_SLOW=0 $(BUILD)/asan/run-tests --shuffle$(if $(SHUFFLE),=$(SHUFFLE))
	@echo "== bad-input sweep under AddressSanitizer and UndefinedBehaviorSanitizer (error paths)"
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 \
	  KILN=$(abspath $(BUILD)/asan/kiln) sh tests/e2e/70-bad-input.sh

# libFuzzer: each target in tests/fuzz/ runs FUZZ_SECONDS from its saved corpus; new
# inputs go to $(BUILD)/fuzz/corpus/NAME, crashes to $(BUILD)/fuzz/crashes/.
fuzz:
	@if ! command -v $(FUZZ_CC) >/dev/null || ! dpkg -s $(FUZZ_DEB_PKGS) >/dev/null 2>&1; then \
	  echo "kiln: installing fuzzing dependencies: $(FUZZ_DEB_PKGS)"; \
	  if [ "$$(id -u)" != 0 ]; then echo "kiln: not root; install: $(FUZZ_DEB_PKGS)" >&2; exit 2; fi; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get update -qq && apt-get install -y -qq --no-install-recommends $(FUZZ_DEB_PKGS) >/dev/null || exit 2; \
	fi
	$(MAKE) --no-print-directory BUILD=$(BUILD)/fuzz CC=$(FUZZ_CC) FUZZ=1 \
	  $(addprefix $(BUILD)/fuzz/fuzz-,$(FUZZ_TARGETS))
	@rm -rf $(BUILD)/fuzz/crashes; fail=0; for t in $(FUZZ_TARGETS); do \
	  mkdir -p $(BUILD)/fuzz/corpus/$$t $(BUILD)/fuzz/crashes; \
	  echo "== fuzz $$t ($(FUZZ_SECONDS)s)"; \
	  $(BUILD)/fuzz/fuzz-$$t -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 \
	    -artifact_prefix=$(BUILD)/fuzz/crashes/$$t- $(BUILD)/fuzz/corpus/$$t tests/fuzz/corpus/$$t \
	    > $(BUILD)/fuzz/$$t.log 2>&1; \
	  grep -E '^(#[0-9]+[[:space:]]+DONE|stat::number_of_executed_units|stat::peak_rss_mb|==[0-9]+==ERROR|SUMMARY)' \
	    $(BUILD)/fuzz/$$t.log; \
	  if ls $(BUILD)/fuzz/crashes/$$t-* >/dev/null 2>&1; then \
	    echo "FAIL fuzz $$t: see $(BUILD)/fuzz/crashes/ and $(BUILD)/fuzz/$$t.log"; fail=1; fi; \
	done; exit $$fail

$(BUILD)/fuzz-%: tests/fuzz/%.c tests/fuzz/libfuzzer/main.c $(BUILD)/libkiln.a
	@echo "  FUZZ    $*"
	@$(CC) $(CFLAGS) $(INCLUDES) $(PKG_CFLAGS) -fsanitize=fuzzer -DKILN_FUZZ_ENTRY=kiln_fuzz_$* \
	  -o $@ tests/fuzz/$*.c tests/fuzz/libfuzzer/main.c $(BUILD)/libkiln.a $(ALL_LIBS)

# One entry point without libFuzzer (gcc): each file named goes through it once (reproducing
# a crash file, recording seeds: tests/fuzz/registry_client_seeds.sh).
$(BUILD)/fuzz-run-%: tests/fuzz/%.c tests/fuzz/libfuzzer/files.c $(BUILD)/libkiln.a
	@echo "  FUZZRUN $*"
	@$(CC) $(CFLAGS) $(INCLUDES) $(PKG_CFLAGS) -DKILN_FUZZ_ENTRY=kiln_fuzz_$* \
	  -o $@ tests/fuzz/$*.c tests/fuzz/libfuzzer/files.c $(BUILD)/libkiln.a $(ALL_LIBS)

# Long-running checks (tests/soak/, docs/soak.md), not part of `make test`: the runtime's
# streams for millions of ticks, a registry under publish/promote/pull load, a trainer killed
# and resumed over and over; resident memory and fds sampled throughout. SOAK_SECONDS in all
# (split between the parts); figures in $(BUILD)/soak/report.txt, exit non-zero on any
# failure. SOAK_SAN=1: the drivers and kiln built with ASan+UBSan (in $(BUILD)/asan; leaks
# are LeakSanitizer's at each exit, RSS is reported only), a shorter default (180 s), the
# report in $(BUILD)/soak/asan/report.txt.
SOAK_SAN ?=
SOAK_SECONDS ?= $(if $(SOAK_SAN),180,600)
SOAK_SRC := $(sort $(wildcard tests/soak/*.c))
SOAK_DRIVERS := $(SOAK_SRC:tests/soak/%.c=$(BUILD)/soak/soak_%)
SOAK_BIN := $(BUILD)$(if $(SOAK_SAN),/asan)
$(SOAK_DRIVERS): $(BUILD)/soak/soak_%: $(BUILD)/obj/tests/soak/%.o $(BUILD)/libkiln.a
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $< $(BUILD)/libkiln.a $(ALL_LIBS)
# Built (not run) by make test too, like the benchmarks, so no driver goes stale unseen.
test: $(SOAK_DRIVERS)

soak: $(if $(SOAK_SAN),,all)
	@if ! command -v curl >/dev/null; then \
	  echo "kiln: installing soak dependencies: $(SOAK_DEB_PKGS)"; \
	  if [ "$$(id -u)" != 0 ]; then echo "kiln: not root; install: $(SOAK_DEB_PKGS)" >&2; exit 2; fi; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get update -qq && apt-get install -y -qq --no-install-recommends $(SOAK_DEB_PKGS) >/dev/null || exit 2; \
	fi
	$(if $(SOAK_SAN),$(MAKE) --no-print-directory BUILD=$(BUILD)/asan SAN=1 $(BUILD)/asan/kiln \
	  $(SOAK_SRC:tests/soak/%.c=$(BUILD)/asan/soak/soak_%),\
	  $(MAKE) --no-print-directory $(SOAK_DRIVERS))
	KILN=$(abspath $(SOAK_BIN)/kiln) SOAK_BIN=$(abspath $(SOAK_BIN)/soak) SOAK_SAN=$(SOAK_SAN) \
	  tests/soak/soak.sh $(SOAK_SECONDS) $(BUILD)/soak$(if $(SOAK_SAN),/asan)

demo: all
	KILN=$(abspath $(BUILD)/kiln) examples/demo.sh

# The same walk against an OCI registry: Debian's docker-registry on loopback instead of
# kiln registry serve (README, "On your OCI registry").
demo-oci: all
	KILN=$(abspath $(BUILD)/kiln) KILN_DEMO_REGISTRY=oci examples/demo.sh

# `make install PREFIX=/usr/local DESTDIR=`: the command, the library (shared, with its soname
# and links, and static), the header and a pkg-config file, so that a service builds with
# `cc svc.c $$(pkg-config --cflags --libs kiln)` (docs/architecture.md, "Installed").
# `make uninstall` removes exactly those files. Neither builds: run `make` first.
PREFIX ?= /usr/local
LIBDIR ?= $(PREFIX)/lib
INSTALLED := bin/kiln include/kiln.h lib/libkiln.so.$(SO_MAJOR).$(SO_MINOR) \
             lib/libkiln.so.$(SO_MAJOR) lib/libkiln.so lib/libkiln.a lib/pkgconfig/kiln.pc
.PHONY: install uninstall
$(BUILD)/kiln.pc: Makefile include/kiln.h
	@mkdir -p $(BUILD)
	@printf '%s\n' 'prefix=$(PREFIX)' 'exec_prefix=$${prefix}' 'libdir=$(LIBDIR)' \
	  'includedir=$${prefix}/include' '' 'Name: kiln' \
	  'Description: kiln models: pull, verify and run them (streams, batches), train, sign, publish' \
	  'Version: $(KILN_VER)' 'Requires.private: $(PKGS)' 'Cflags: -I$${includedir}' \
	  'Libs: -L$${libdir} -lkiln' 'Libs.private: $(strip $(CU_LIBS) $(LDLIBS))' > $@.tmp
	@mv $@.tmp $@
install: $(BUILD)/kiln.pc
	@for f in $(BUILD)/kiln $(BUILD)/libkiln.so $(BUILD)/libkiln.a; do \
	  [ -f $$f ] || { echo "make install: $$f is not built: run make first" >&2; exit 2; }; done
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(LIBDIR)/pkgconfig
	install -m 755 $(BUILD)/kiln $(DESTDIR)$(PREFIX)/bin/kiln
	install -m 644 include/kiln.h $(DESTDIR)$(PREFIX)/include/kiln.h
	install -m 755 $(BUILD)/libkiln.so $(DESTDIR)$(LIBDIR)/libkiln.so.$(SO_MAJOR).$(SO_MINOR)
	ln -sf libkiln.so.$(SO_MAJOR).$(SO_MINOR) $(DESTDIR)$(LIBDIR)/libkiln.so.$(SO_MAJOR)
	ln -sf libkiln.so.$(SO_MAJOR) $(DESTDIR)$(LIBDIR)/libkiln.so
	install -m 644 $(BUILD)/libkiln.a $(DESTDIR)$(LIBDIR)/libkiln.a
	install -m 644 $(BUILD)/kiln.pc $(DESTDIR)$(LIBDIR)/pkgconfig/kiln.pc
	@if [ -z "$(DESTDIR)" ] && command -v ldconfig >/dev/null; then ldconfig; fi
uninstall:
	rm -f $(DESTDIR)$(PREFIX)/bin/kiln $(DESTDIR)$(PREFIX)/include/kiln.h \
	  $(DESTDIR)$(LIBDIR)/libkiln.so.$(SO_MAJOR).$(SO_MINOR) $(DESTDIR)$(LIBDIR)/libkiln.so.$(SO_MAJOR) \
	  $(DESTDIR)$(LIBDIR)/libkiln.so $(DESTDIR)$(LIBDIR)/libkiln.a $(DESTDIR)$(LIBDIR)/pkgconfig/kiln.pc

clean:
	rm -rf $(BUILD)

# The benchmarks' too: bench_watch.o, built before kiln_pull_opts grew its limits, was kept
# and read the new fields as garbage ("max_size 100 bytes").
-include $(LIB_OBJ:.o=.d) $(DIST_OBJ:.o=.d) $(CLI_OBJ:.o=.d) $(TEST_OBJ:.o=.d) \
         $(SOAK_SRC:%.c=$(BUILD)/obj/%.d) $(wildcard $(BUILD)/obj/bench/*.d)
FORCE:

# The CUDA path checked on a GPU (tests/gpu/run.sh runs it); built only where nvcc is.
.PHONY: gpu-check
ifneq ($(CU_SRC),)
gpu-check: $(BUILD)/gpu-check
# With NCCL it checks the trainer through an NCCL communicator of one rank: it links
# comm_nccl.o from libkiln_dist.a (not comm_mpi.o, so no libmpi), which opens libnccl.
$(BUILD)/obj/tests/gpu/check.o: CFLAGS += $(if $(NCCL_H),-DKILN_HAVE_NCCL)
$(BUILD)/gpu-check: $(BUILD)/obj/tests/gpu/check.o $(BUILD)/libkiln.a $(BUILD)/libkiln_dist.a
	$(CC) $(LDFLAGS) -o $@ $< $(if $(NCCL_H),$(BUILD)/libkiln_dist.a) $(BUILD)/libkiln.a $(ALL_LIBS)
-include $(BUILD)/obj/tests/gpu/check.d
else
gpu-check:
	@echo "gpu-check: nvcc was not found, so this build has no CUDA" >&2; exit 2
endif

# The CUDA sources run on the CPU through an emulator (a fiber per CUDA thread, cuBLAS over
# OpenBLAS): gpu-check and the C suite's cuda tests without a GPU, about five minutes; with
# EMU_SAN=1 under AddressSanitizer. Needs g++ and python3; not part of `make test`.
.PHONY: gpu-emu
gpu-emu: $(BUILD)/tests.inc
	tests/gpu/emu/emu.sh
