# kiln - build, test, demo. `make` builds build/libkiln.{a,so} and build/kiln;
# `make test` runs the whole suite; `make demo` runs the pipeline end to end.
# Missing Debian packages are installed with apt-get on first use (root).

BUILD ?= build
SAN ?=
CC ?= cc
PKGS := libsodium jansson sqlite3 openblas
# Debian packages that provide the pkg-config names above, and the tools the tests use.
DEB_PKGS := pkg-config libsodium-dev libjansson-dev libsqlite3-dev libopenblas-dev sqlite3

NVCC ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
ifneq ($(SAN),)
NVCC :=
endif
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))

GIT_REV := $(shell git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
MODULES := core kernels kernels/cpu train runtime export validate sign registry
INCLUDES := -Iinclude $(addprefix -I,$(wildcard $(MODULES)))

PKG_CFLAGS = $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS = $(shell pkg-config --libs $(PKGS) 2>/dev/null)

CFLAGS := -std=c11 -D_GNU_SOURCE -O2 -g -Wall -Wextra -Werror -Wno-unused-parameter \
          -fPIC -fvisibility=hidden -pthread -DKILN_GIT_REV='"$(GIT_REV)"'
LDLIBS := -lm -pthread

ifneq ($(SAN),)
CFLAGS += -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
LDFLAGS += -fsanitize=address,undefined
endif

LIB_SRC := $(sort $(wildcard core/*.c kernels/cpu/*.c kernels/*.c train/*.c runtime/*.c export/*.c \
                              validate/*.c sign/*.c registry/*.c))
CLI_SRC := $(sort $(wildcard cli/*.c))
TEST_SRC := $(sort $(wildcard tests/*.c))
CU_SRC := $(if $(NVCC),$(sort $(wildcard kernels/cuda/*.cu)))

ifneq ($(CU_SRC),)
CFLAGS += -DKILN_HAVE_CUDA
# nvcc's host code (kernel launch stubs) needs the C++ runtime.
CU_LIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublas -lcudart -lstdc++
# Hopper natively, PTX for newer chips, Ampere as the generic target.
NVCC_ARCH ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
             -gencode arch=compute_90,code=compute_90
NVCC_FLAGS := -O2 -std=c++17 $(NVCC_ARCH) -Werror all-warnings -DKILN_HAVE_CUDA \
              -Xcompiler -fPIC,-fvisibility=hidden,-Wall,-Wextra,-Werror,-Wno-unused-parameter
endif

LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/obj/%.o) $(CU_SRC:%.cu=$(BUILD)/obj/%.cu.o)
CLI_OBJ := $(CLI_SRC:%.c=$(BUILD)/obj/%.o)
TEST_OBJ := $(TEST_SRC:%.c=$(BUILD)/obj/%.o)
ALL_LIBS = $(PKG_LIBS) $(CU_LIBS) $(LDLIBS)

DEPS_STAMP := $(BUILD)/.deps-ok

.PHONY: all deps test test-c test-e2e test-asan demo clean bench fuzz
all: $(BUILD)/libkiln.a $(BUILD)/libkiln.so $(BUILD)/kiln $(BUILD)/run-tests

# Install what is missing, once per build directory. pkg-config answers for the
# libraries; the tools are probed by name.
deps: $(DEPS_STAMP)
$(DEPS_STAMP):
	@mkdir -p $(BUILD)
	@if ! command -v pkg-config >/dev/null || ! pkg-config --exists $(PKGS) || ! command -v sqlite3 >/dev/null; then \
	  echo "kiln: installing build dependencies: $(DEB_PKGS)"; \
	  if [ "$$(id -u)" != 0 ]; then echo "kiln: missing packages and not root; install: $(DEB_PKGS)" >&2; exit 2; fi; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get update -qq && apt-get install -y -qq --no-install-recommends $(DEB_PKGS) >/dev/null || exit 2; \
	fi
	@touch $@

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

$(BUILD)/libkiln.so: $(LIB_OBJ)
	$(CC) -shared $(LDFLAGS) -o $@ $^ $(ALL_LIBS)

$(BUILD)/kiln: $(CLI_OBJ) $(BUILD)/libkiln.a
	$(CC) $(LDFLAGS) -o $@ $(CLI_OBJ) $(BUILD)/libkiln.a $(ALL_LIBS)

# The test table is generated from the KILN_TEST(name) definitions in tests/*.c.
$(BUILD)/tests.inc: $(TEST_SRC)
	@mkdir -p $(BUILD)
	@grep -ho '^KILN_TEST([a-z0-9_]*)' $(TEST_SRC) | sed 's/KILN_TEST(\(.*\))/T(\1)/' > $@.tmp && mv $@.tmp $@

# The CPU kernels are the trainer's inner loops: -O3 vectorises their fixed-order loops.
$(BUILD)/obj/kernels/cpu/%.o: CFLAGS += -O3

$(BUILD)/obj/tests/run.o: $(BUILD)/tests.inc
$(BUILD)/obj/tests/%.o: INCLUDES += -I$(BUILD)

$(BUILD)/run-tests: $(TEST_OBJ) $(BUILD)/libkiln.a
	$(CC) $(LDFLAGS) -o $@ $(TEST_OBJ) $(BUILD)/libkiln.a $(ALL_LIBS)

test: all
	@echo "== C suite"
	KILN_BUILD=$(BUILD) $(BUILD)/run-tests
	@echo "== end-to-end"
	KILN=$(abspath $(BUILD)/kiln) tests/e2e/run-all
	@echo "== C suite under AddressSanitizer and UndefinedBehaviorSanitizer"
	$(MAKE) --no-print-directory BUILD=$(BUILD)/asan SAN=1 $(BUILD)/asan/run-tests
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 \
	  KILN_BUILD=$(BUILD)/asan KILN_SLOW=0 $(BUILD)/asan/run-tests

demo: all
	KILN=$(abspath $(BUILD)/kiln) examples/demo.sh

clean:
	rm -rf $(BUILD)

-include $(LIB_OBJ:.o=.d) $(CLI_OBJ:.o=.d) $(TEST_OBJ:.o=.d)

# The CUDA path checked on a GPU (tests/gpu/run.sh runs it); built only where nvcc is.
.PHONY: gpu-check
ifneq ($(CU_SRC),)
gpu-check: $(BUILD)/gpu-check
$(BUILD)/gpu-check: $(BUILD)/obj/tests/gpu/check.o $(BUILD)/libkiln.a
	$(CC) $(LDFLAGS) -o $@ $< $(BUILD)/libkiln.a $(ALL_LIBS)
-include $(BUILD)/obj/tests/gpu/check.d
else
gpu-check:
	@echo "gpu-check: nvcc was not found, so this build has no CUDA" >&2; exit 2
endif

# The CUDA sources run on the CPU through an emulator (a fiber per CUDA thread, cuBLAS over
# OpenBLAS): gpu-check and the C suite's cuda tests without a GPU, about two minutes; with
# EMU_SAN=1 under AddressSanitizer. Needs g++ and python3; not part of `make test`.
.PHONY: gpu-emu
gpu-emu: $(BUILD)/tests.inc
	tests/gpu/emu/emu.sh
