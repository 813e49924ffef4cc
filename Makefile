# The two entry points: `make run` and `make test`. Both install what is missing (scripts/deps.sh),
# configure with CMake and build before doing their job.
#   BUILD_TYPE=Release|Debug|RelWithDebInfo   SANITIZE=address|thread   JOBS=N   PREFIX=DIR (install)
BUILD_TYPE ?= Release
SANITIZE   ?=
JOBS       ?= $(shell nproc)
BUILD_DIR  ?= build$(if $(SANITIZE),-$(SANITIZE))
# Under TSan only the tests that exercise threads run (label `concurrency`); the rest is
# single-threaded and covered by the ASan+UBSan build.
CTEST_ARGS ?= $(if $(filter thread,$(SANITIZE)),-L concurrency)
RUN_ARGS   ?= --ssd-cache-dir ./kvtier-data
# Under ASan, Mesa's lavapipe is kept loaded for the whole process: the Vulkan loader unloads it
# at vkDestroyInstance, and LeakSanitizer then reports 128 bytes lavapipe keeps from its first
# device enumeration (a plain create/destroy program without kvtier reports them too). Loaded,
# they are reachable, not a leak. verify_asan_link_order: the preload comes before ASan's runtime.
LAVAPIPE   := $(firstword $(wildcard /usr/lib/*/libvulkan_lvp.so))
ASAN_VULKAN_ENV = $(if $(LAVAPIPE),LD_PRELOAD="$(LAVAPIPE)" ASAN_OPTIONS="verify_asan_link_order=0 $(ASAN_OPTIONS)")

.PHONY: all deps configure build test run bench install package clean
all: build

deps:
	@scripts/deps.sh

# scripts/glslang.sh names a glslang that compiles the cooperative-matrix-2 kernels (built once
# into ~/.cache/kvtier on Debian 12; found at once after that), or nothing.
configure: deps
	@cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) \
	  -DKVTIER_SANITIZE=$(SANITIZE) -DKVTIER_GLSLANG_COOPMAT2="$$(scripts/glslang.sh)" >/dev/null

build: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS)

test: build
	@cd $(BUILD_DIR) && TSAN_OPTIONS="suppressions=$(CURDIR)/tests/tsan.supp $(TSAN_OPTIONS)" \
	  $(if $(filter address,$(SANITIZE)),$(ASAN_VULKAN_ENV)) \
	  ctest --output-on-failure -j $(JOBS) $(CTEST_ARGS)

run: build
	@$(BUILD_DIR)/server/kvtierd $(RUN_ARGS)

# PREFIX=/opt/kvtier to install elsewhere than CMake's default (/usr/local).
install: build
	@cmake --install $(BUILD_DIR) $(if $(PREFIX),--prefix $(PREFIX))

# One .deb in $(BUILD_DIR) (CPack); its dependencies are the Debian packages the programs load.
package: build
	@cd $(BUILD_DIR) && cpack -G DEB

bench: build
	@scripts/run_benches.sh $(BUILD_DIR)

clean:
	rm -rf build build-address build-thread
