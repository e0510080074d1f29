# Thin wrapper over CMake. `make` builds Release into build/, `make test` runs ctest.
BUILD ?= build
JOBS ?= $(shell nproc)
MODEL_DIR ?= models
MODEL := $(MODEL_DIR)/SmolLM2-135M-Instruct.Q4_1.gguf
OROCHI_BIN := $(BUILD)/bin/orochi

.PHONY: all build test models demo asan fuzz clean format

all: build

build:
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) $(CTEST_FLAGS)

asan:
	$(MAKE) BUILD=build-asan CMAKE_FLAGS="-DOROCHI_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo" test

fuzz:
	@cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DOROCHI_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	@cmake --build build-fuzz -j $(JOBS) --target fuzz_gguf

models: $(MODEL)

$(MODEL):
	bash deploy/fetch-model.sh $(MODEL_DIR)

demo: models build
	/usr/bin/python3 bench/spec_bench.py --demo --bin-dir $(BUILD)/bin --model $(MODEL)

format:
	clang-format -i $$(git ls-files '*.c' '*.h')

clean:
	rm -rf build build-asan build-fuzz
