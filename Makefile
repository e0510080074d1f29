# Thin wrapper over CMake. `make` builds Release into build/, `make test` runs ctest.
# LLAMA_CPP: the bin directory of a CPU-only llama.cpp build (the speed peer of `make bench-peer`),
# as ../shared/bench/build-peer.sh prints it; PEER_FLAGS: extra bench/peer.py options (e.g. --quick).
BUILD ?= build
JOBS ?= $(shell nproc)
MODEL_DIR ?= models
MODEL := $(MODEL_DIR)/SmolLM2-135M-Instruct.Q4_1.gguf
OROCHI_BIN := $(BUILD)/bin/orochi
LLAMA_CPP ?= /tmp/llama.cpp/build/bin
PEER_FLAGS ?=

.PHONY: all deps build test test-lb models demo bench-peer bench-group bench-act-bits bench-concurrency asan fuzz fuzz-long soak soak-asan clean format

all: build

build:
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

# the Debian packages (deploy/install-deps.sh: idempotent, quick when everything is there)
deps:
	@bash deploy/install-deps.sh

# `make test` on a fresh machine: the packages, the build, the default model, then the tests
test: deps
	@$(MAKE) --no-print-directory build models
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) $(CTEST_FLAGS)

# two groups in network namespaces behind HAProxy (deploy/orochi-balance), one killed under load
# (tests/integration/test_balancer.py; also part of `make test` where namespaces are allowed)
test-lb: build models
	OROCHI_MODEL=$(MODEL) OROCHI_TMP=$(BUILD)/test-tmp /usr/bin/python3 -u tests/integration/test_balancer.py

asan:
	$(MAKE) BUILD=build-asan CMAKE_FLAGS="-DOROCHI_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo" test

# libFuzzer targets (clang) into build-fuzz/bin; tests/fuzz/run_fuzz.sh runs them, docs/fuzzing.md
fuzz:
	@cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DOROCHI_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	@cmake --build build-fuzz -j $(JOBS) --target fuzzers

# every fuzz target for 10 million executions, one after the other; FUZZ_RUNS=N to change
FUZZ_RUNS ?= 10000000
fuzz-long:
	JOBS=$(JOBS) bash tests/fuzz/run_fuzz.sh --runs $(FUZZ_RUNS)

# a 10-minute chaos soak with 8 clients and a kill or stop every 5 s (bench/soak.py; SOAK_FLAGS
# for more, e.g. --bin-dir build-asan/bin to run it under ASan)
SOAK_FLAGS ?=
soak: build models
	/usr/bin/python3 bench/soak.py --minutes 10 --clients 8 --kill-every 5 --bin-dir $(BUILD)/bin --model $(MODEL) $(SOAK_FLAGS)

# the same soak on the ASan + UBSan build, with ASan's quarantines off so that the coordinator's
# private RSS shows the program's memory, not ASan's pile of freed chunks (docs/security.md)
soak-asan: models
	$(MAKE) BUILD=build-asan CMAKE_FLAGS="-DOROCHI_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo" build
	ASAN_OPTIONS=quarantine_size_mb=0:thread_local_quarantine_size_kb=0 /usr/bin/python3 bench/soak.py \
		--minutes 10 --clients 8 --kill-every 5 --bin-dir build-asan/bin --model $(MODEL) $(SOAK_FLAGS)

models: $(MODEL)

$(MODEL):
	bash deploy/fetch-model.sh $(MODEL_DIR)

demo: deps
	@$(MAKE) --no-print-directory build models
	/usr/bin/python3 bench/spec_bench.py --demo --bin-dir $(BUILD)/bin --model $(MODEL)

bench-peer: build models
	/usr/bin/python3 bench/peer.py --bin-dir $(BUILD)/bin --model $(MODEL) --llama-cpp $(LLAMA_CPP) $(PEER_FLAGS)

# What 8-bit activations cost in accuracy (docs/performance.md, "8-bit activations"): perplexity
# and argmax agreement of --act-bits 8 against 16 on the README and docs/speculation.md.
bench-act-bits: build models
	/usr/bin/python3 bench/act_bits.py --bin-dir $(BUILD)/bin --model $(MODEL)

# Throughput with 1, 4 and 8 requests in flight (docs/performance.md, "Prompt lookup in the free
# run"): 1 worker x 2 threads, 8-bit activations, f16 K/V, 24 requests per level kept in flight, 3
# interleaved rounds, without and with ngram, both with a plan profiled first (its step-time
# curve is what prompt lookup in the free run weighs drafts against); every answer checked
# against `orochi run`. About 4 minutes.
BENCH_PLAN := $(BUILD)/bench-plan.json
bench-concurrency: build models
	$(BUILD)/bin/orochi profile --model $(MODEL) --threads 2 --widths 1,2,4,8,16 --per-category 3 -n 64 --act-bits 8 --kv f16 --reps 20 --out $(BENCH_PLAN)
	/usr/bin/python3 bench/spec_bench.py --bin-dir $(BUILD)/bin --model $(MODEL) --workers 1 --threads-per-worker 2 --rounds 3 --concurrency 1,4,8 --concurrency-spec none --categories code,summarize,math -n 128 --extra "--act-bits 8 --kv f16 --plan $(BENCH_PLAN)"
	/usr/bin/python3 bench/spec_bench.py --bin-dir $(BUILD)/bin --model $(MODEL) --workers 1 --threads-per-worker 2 --rounds 3 --concurrency 1,4,8 --concurrency-spec ngram --categories code,summarize,math -n 128 --extra "--act-bits 8 --kv f16 --plan $(BENCH_PLAN)"

# A group without speculators against `orochi run` with the same threads (docs/performance.md,
# "The group's handoff"): the default model and its F16 copy (made once with orochi quantize, in
# the directory bench-peer uses), free run on and off, 1 worker x 2 threads and 2 x 1.
PEER_F16 := bench/results/peer-models/SmolLM2-135M-Instruct.F16.gguf
bench-group: build models
	test -f $(PEER_F16) || (mkdir -p $(dir $(PEER_F16)) && $(OROCHI_BIN) quantize $(MODEL) $(PEER_F16) F16)
	/usr/bin/python3 bench/group_vs_run.py --bin-dir $(BUILD)/bin --models $(MODEL),$(PEER_F16) $(GROUP_FLAGS)

# Medusa heads for the default model: `orochi train-medusa` (docs/medusa.md, "Training"):
# documentation prompts (continued as plain text, and chat-wrapped), instruction prompts, the
# target's greedy generations and hidden states, then tools/train_medusa.py. About 15 minutes on
# 2 cores with OpenBLAS (deploy/install-deps.sh installs it; the reference BLAS is 12 times
# slower). Resumable: run it again after an interruption. MEDUSA_PROMPTS plain and chat prompts
# each, MEDUSA_INSTRUCT instruction prompts, MEDUSA_TOKENS generated tokens each, MEDUSA_HEADS
# heads, MEDUSA_EPOCHS epochs; the work files stay in $(MEDUSA_WORK).
MEDUSA_OUT ?= $(MODEL_DIR)/SmolLM2-135M-Instruct.medusa.gguf
MEDUSA_WORK ?= $(BUILD)/medusa-train
MEDUSA_PROMPTS ?= 500
MEDUSA_INSTRUCT ?= 600
MEDUSA_TOKENS ?= 128
MEDUSA_HEADS ?= 4
MEDUSA_EPOCHS ?= 3
.PHONY: medusa-heads
medusa-heads: build models
	OROCHI_SOURCE=$(CURDIR) $(OROCHI_BIN) train-medusa --target $(MODEL) --out $(MEDUSA_OUT) --work $(MEDUSA_WORK) \
		--heads $(MEDUSA_HEADS) --prompts $(MEDUSA_PROMPTS) --instruct $(MEDUSA_INSTRUCT) \
		--tokens $(MEDUSA_TOKENS) --epochs $(MEDUSA_EPOCHS) --seed 1

format:
	clang-format -i $$(git ls-files '*.c' '*.h')

clean:
	rm -rf build build-asan build-fuzz
