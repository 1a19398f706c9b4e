# InferLoop: build, run and test the inferloopd daemon.
#
#   make run    install deps, fetch the model, build, start the server
#   make test   fmt + clippy + Rust tests + Python (openai client) tests
#
# Variables you may override: MODEL, MODEL_Q8, HOST, PORT, ARGS (extra serve flags),
# BENCH_ARGS (extra bench.py flags), PYTHON.

SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

# rustup installs into ~/.cargo/bin, which a fresh shell may not have on PATH.
export PATH := $(HOME)/.cargo/bin:$(PATH)

PYTHON ?= python3
MODEL  ?= models/SmolLM2-135M-Instruct.Q4_1.gguf
MODEL_Q8 ?= models/SmolLM2-135M-Instruct.Q8_0.gguf
HOST   ?= 127.0.0.1
PORT   ?= 8080
ARGS   ?=
BENCH_ARGS ?=

BIN   := target/release/inferloopd
VENV  := .venv
# vLLM's router (PyPI wheel: a Python launcher around its Rust core), pinned, in a venv of its
# own: deploy/vllm-router's test (make pytest) and make lan-demo run it.
VLLM_ROUTER_VERSION := 0.1.17
ROUTER_VENV := .venv-router
ROUTER_STAMP := $(ROUTER_VENV)/.installed-$(VLLM_ROUTER_VERSION)
# --locked only once Cargo.lock exists (it is committed; this keeps a fresh
# checkout without one buildable).
LOCKED := $(if $(wildcard Cargo.lock),--locked,)

# llama.cpp's C++ (llama-cpp-sys-2's CMake build, ~6 minutes on 2 cores) is compiled by more
# than one build here: the workspace and the fuzz targets (fuzz/Cargo.toml builds it with the
# same Release flags). With ccache installed CMake runs each compile through it, so the second
# build of the same sources and flags is served from the cache. CCACHE=0 turns it off.
CCACHE ?= 1
ifneq ($(CCACHE),0)
ifneq ($(shell command -v ccache 2>/dev/null),)
export CMAKE_C_COMPILER_LAUNCHER ?= ccache
export CMAKE_CXX_COMPILER_LAUNCHER ?= ccache
endif
endif

# Tests load the real model; they find it through this variable.
INFERLOOP_TEST_MODEL ?= $(abspath $(MODEL))
export INFERLOOP_TEST_MODEL

.PHONY: help deps model model-q8 build run test pytest bench bench-peer bench-prefix bench-prefix-restart bench-prefix-smoke bench-kv bench-speed bench-flood kernels-check kernel-bench device-bundle fmt clippy clean venv

help:
	@echo "InferLoop make targets:"
	@echo "  run      deps + model + build, then serve on http://$(HOST):$(PORT) (ARGS= adds flags)"
	@echo "  test     fmt check, clippy, cargo test (release), Python client tests"
	@echo "  deps     install system packages / check the Rust toolchain"
	@echo "  model    download and verify $(MODEL)"
	@echo "  model-q8 $(MODEL_Q8), quantized from $(MODEL) by inferloopd quantize"
	@echo "  golden   llama.cpp vs the native forward pass on $(MODEL_Q8), bench/golden-prompts.txt -> out/golden.json"
	@echo "  build    cargo build --release"
	@echo "  pytest   Python tests with the official openai client (in $(VENV)), the Codex CLI and headless Chromium"
	@echo "  codex-cli  install the pinned Codex CLI from npm into $(CODEX_DIR) (pytest does it too)"
	@echo "  bench    TTFT and decode throughput benchmark -> bench/results/latest.json"
	@echo "  bench-peer  the same, side by side with llama.cpp's llama-server (built from PyPI sources)"
	@echo "  bench-prefix  prompt reuse (shared prefixes, chats, a random-workload generator) vs llama-server's prompt cache -> bench/results/prefix.json"
	@echo "  bench-prefix-restart  inferloopd's prompts warm after a restart (disk tier on, and off as the control) -> bench/results/prefix-restart.json"
	@echo "  bench-prefix-smoke  bench/prefix.py's bands, tier table and restart run against a stand-in daemon (seconds, no model)"
	@echo "  bench-flood  30,000 idle and trickling sockets against the default connection cap: the daemon's fds, RSS and a real request's TTFT before, during and after -> bench/results/flood.json"
	@echo "  bench-kv  --kv-type f16/q8_0/q4_0: the largest slots x ctx one memory limit admits (boot check, then a real cgroup as root), golden KL against f16 KV -> bench/results/kv.json"
	@echo "  bench-speed  speculative decoding (n-gram, draft model) and q8_0 KV: decode tok/s on grounded, code-edit and chat workloads vs llama-server's spec modes -> bench/results/speed.json"
	@echo "  soak     mixed traffic for SOAK_DURATION (default 2h) at SOAK_RATE req/s (default 1): RSS, fds, threads, KV cells, queue sampled every 10 s; fails on an upward slope, no return to idle or any 5xx -> out/soak/ (series.json, summary.json, soak.svg)"
	@echo "  soak-smoke  the same for 5 minutes -> out/soak-smoke/"
	@echo "  lan-demo  3 boxes behind vllm-router (round_robin, power_of_two, cache_aware, kv_aware on the boxes' KV events): TTFT, prefix hit rate, throughput, then kill -9 / rejoin / thermal critical / drain under load -> bench/results/lan.json"
	@echo "  lan-demo-smoke  the same with 2 boxes, round_robin and cache_aware, kill/rejoin/drain (CI; fails on a fault target)"
	@echo "  router-wheels  vllm-router $(VLLM_ROUTER_VERSION) and its dependencies as wheels: out/router-wheels (this machine), out/router-wheels-aarch64 (CPython 3.11) for a gateway image's [gateway] wheels"
	@echo "  kernels-check  the shipped kernels without a GPU: sm_87/sm_90 cubins + PTX 8.2 (NVRTC/ptxas 12.2 from PyPI) -> out/kernels/"
	@echo "  cuda-sim-test  the CUDA path without a GPU: kernel tests, the daemon's CUDA pass, golden and serving on the CUDA emulator"
	@echo "  device-check-sim  make device-bundle, then scripts/device-check.sh dry-run on the CUDA emulator (QUICK=1) -> out/device-check-sim/summary.json"
	@echo "  device-check-rehearse  device-check.sh three ways: on the emulator (passes), no libcuda, a corrupted module (both fail naming it)"
	@echo "  kernels-test-aarch64  the CPU twins' tests cross-built for aarch64, run under qemu-user (NEON)"
	@echo "  kernel-bench   q8-bench on the CPU twin (DEVICE=cuda on a GPU) -> out/kernels/bench.json"
	@echo "  gpu-sim-bench GPGPUSIM_SRC=DIR  decode kernels' bandwidth on a simulated Orin NX (GPGPU-Sim; not in CI; QUICK=1) -> out/gpu-sim/bench.json"
	@echo "  fuzz-gguf      the GGUF reader under 1,000,000 random mutations of the model's header"
	@echo "  fuzz     libFuzzer (cargo fuzz) on every target in fuzz/, FUZZ_RUNS=$(FUZZ_RUNS) executions each -> out/fuzz/summary.txt"
	@echo "  fuzz-smoke  every fuzz target for $(FUZZ_SMOKE_RUNS) executions or 20 s (in check-long)"
	@echo "  test-native  the qualification suite and the openai tests against --backend native on the Q8_0 model"
	@echo "  qual     the 385-case qualification suite (spawn mode) -> out/qual/report.html"
	@echo "  qual-peer  the same cases against llama.cpp's llama-server (attach mode) -> out/qual-peer/, with compare.md"
	@echo "  cross    inferloopd, inferloop-qual and inferloop-ota for aarch64 (Jetson Orin); cross-test runs inferloopd under qemu"
	@echo "  image    build image/examples/orin-nx-16gb.toml into out/image/ and verify it"
	@echo "  ota-keys development CA + code-signing cert into $(OTA_KEYS)/ (never ship them)"
	@echo "  bundle   build $(OTA_SPEC) and sign it into $(BUNDLE) with the dev keys"
	@echo "  ota-test  A/B updates with the real RAUC on loop devices (root): install, refusals, kill -9, rollback"
	@echo "  ota-kill  the kill -9 mid-write case $(OTA_KILL_RUNS_MANY) times"
	@echo "  ota-demo  keys, images 1.0.0 and 1.1.0, bundles into out/ota-demo/, then install -> reboot -> mark-good"
	@echo "  fleet-test  the inferloop-ota agent on simulated boxes against a real goosebit (root): rollouts, failures, resume, ten boxes"
	@echo "  fleet-demo  goosebit, two bundles, three boxes, a rollout -> out/fleet-demo/devices.json"
	@echo "  check-long  what CI leaves out for time: fuzz-smoke, soak-smoke, cuda-sim-test (both orders), vm-test (root; ~20 min)"
	@echo "  fmt, clippy, clean"

deps:
	scripts/install-deps.sh

model:
	scripts/fetch-model.sh

# The Q8_0 weights the native engine reads, made from $(MODEL) by llama.cpp's own quantizer
# (a second); redone only when $(MODEL) is newer.
model-q8: model build
	@if [ -f $(MODEL_Q8) ] && [ $(MODEL_Q8) -nt $(MODEL) ]; then \
	  echo "$(MODEL_Q8) is up to date"; \
	else \
	  ./$(BIN) quantize --in $(MODEL) --out $(MODEL_Q8) --type q8_0; \
	fi

# llama.cpp and the native forward pass on the same tokens of every prompt (plus a greedy
# continuation), compared position by position: top-1 agreement, KL, logit difference.
# GOLDEN_ARGS adds flags (--continue N, --threads N, --reference F32.gguf).
GOLDEN_ARGS ?=
.PHONY: golden
golden: model-q8
	mkdir -p out
	./$(BIN) golden --model $(MODEL_Q8) --prompts bench/golden-prompts.txt --noise-floor --json $(GOLDEN_ARGS) > out/golden.json
	cat out/golden.json

build: deps
	cargo build --release $(LOCKED)

run: deps model build
	@echo
	@echo "InferLoop is starting on http://$(HOST):$(PORT)"
	@echo "Try it from another shell:"
	@echo "  curl -s http://$(HOST):$(PORT)/v1/chat/completions \\"
	@echo "    -H 'Content-Type: application/json' \\"
	@echo "    -d '{\"model\":\"SmolLM2-135M-Instruct.Q4_1\",\"messages\":[{\"role\":\"user\",\"content\":\"Say hello\"}],\"max_tokens\":32}'"
	@echo
	exec ./$(BIN) serve --model $(MODEL) --host $(HOST) --port $(PORT) $(ARGS)

# clippy runs with --release so that it reuses the release build of llama.cpp
# (llama-cpp-sys-2 builds it again, as RelWithDebInfo, for the dev profile:
# minutes on 2 cores). It lints the same code. Every cargo command here takes the whole
# workspace (`--workspace`, then `--bin`/`--example` to pick targets), never `-p`: a build of
# some packages only resolves the dependencies' features otherwise and compiles them, and the
# daemon, once more.
# fuzz/ is its own workspace (it pulls in libFuzzer); linted in the main target directory,
# where the daemon's llama.cpp is already built.
CLIPPY_FUZZ = CARGO_TARGET_DIR=$(abspath target) cargo clippy --manifest-path fuzz/Cargo.toml --release $(LOCKED) --bins -- -D warnings
# model-q8: the image tests compare the Orin example's pin with the file it makes;
# router-wheels and .venv-router: they build gateway images from both.
test: deps model model-q8 router-wheels $(ROUTER_STAMP)
	cargo fmt --all -- --check
	cargo fmt --manifest-path fuzz/Cargo.toml --all -- --check
	cargo clippy --workspace --all-targets --release $(LOCKED) -- -D warnings
	$(CLIPPY_FUZZ)
	cargo test --workspace --release $(LOCKED)
	$(MAKE) --no-print-directory pytest

# The venv is rebuilt when the pinned requirements change.
$(VENV)/.installed: tests/python/requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --disable-pip-version-check -q -r tests/python/requirements.txt
	touch $@

venv: $(VENV)/.installed

# The Codex CLI (a self-contained binary from npm) for tests/python/test_codex_cli.py, a
# real client that speaks only the Responses API. pytest tries to install it; where npm or
# its registry is out of reach that test skips and says why.
CODEX_VERSION := 0.169.0
CODEX_DIR     ?= out/codex
CODEX_BIN     := $(CODEX_DIR)/node_modules/.bin/codex

.PHONY: codex-cli
codex-cli: $(CODEX_BIN)

$(CODEX_BIN):
	npm install --no-audit --no-fund --prefix $(CODEX_DIR) @openai/codex@$(CODEX_VERSION)

pytest: $(VENV)/.installed $(ROUTER_STAMP) model build
	-$(MAKE) --no-print-directory codex-cli
	CODEX_BIN=$(abspath $(CODEX_BIN)) INFERLOOPD=$(abspath $(BIN)) $(VENV)/bin/pytest -q -rs --durations=12 tests/python

bench: $(VENV)/.installed model build model-q8
	cargo build --release $(LOCKED) --workspace --example raw_decode
	$(VENV)/bin/python bench/bench.py --daemon $(BIN) --model $(MODEL) --reference target/release/examples/raw_decode \
	  --native-model $(MODEL_Q8) $(BENCH_ARGS)

# The peer is llama.cpp's own llama-server, built by scripts/build-peer.sh into peer/.
bench-peer: $(VENV)/.installed model build
	scripts/build-peer.sh
	cargo build --release $(LOCKED) --workspace --example raw_decode
	$(VENV)/bin/python bench/bench.py --daemon $(BIN) --model $(MODEL) --reference target/release/examples/raw_decode --peer peer/llama-server $(BENCH_ARGS)

# Prompt reuse: TTFT on shared system prompts, 8 apps over 4 slots, multi-turn chats and
# never-reusable prompts, against llama-server with its prompt cache on (its default).
# BENCH_ARGS="--quick --workloads shared" for a smoke run.
bench-prefix: $(VENV)/.installed model build
	scripts/build-peer.sh
	$(VENV)/bin/python bench/prefix.py --daemon $(BIN) --model $(MODEL) --peer peer/llama-server $(BENCH_ARGS)

# inferloopd only (llama-server keeps no prompt across a restart): no peer build.
bench-prefix-restart: $(VENV)/.installed model build
	$(VENV)/bin/python bench/prefix.py --daemon $(BIN) --model $(MODEL) --servers inferloopd \
		--workloads restart --output bench/results/prefix-restart.json $(BENCH_ARGS)

# KV cache types: the largest slots x ctx that one memory limit admits for each --kv-type
# (the daemon's boot check; as root, also served and refused in a real memory cgroup), and
# golden's KL of q8_0 and q4_0 KV against f16 KV on bench/golden-prompts.txt. Minutes.
# BENCH_ARGS="--limit-mb 2048 --slots 4", "--fill" (worst case in the cgroup), "--no-golden".
# Tens of thousands of sockets (root raises the fd limits it needs); about a minute.
bench-flood: model build
	python3 bench/flood.py --daemon $(BIN) --model $(MODEL) $(BENCH_ARGS)

bench-kv: model build
	python3 bench/kv.py --daemon $(BIN) --model $(MODEL) $(BENCH_ARGS)

# Speculative decoding and q8_0 KV, side by side with llama-server's n-gram modes, on three
# workloads (grounded, code edit, open chat). Tens of minutes; BENCH_ARGS="--quick" for a smoke
# run, "--draft-model $(MODEL)" adds the draft-model configurations (the main model is then
# $(MODEL_Q8) unless MODEL is set).
bench-speed: $(VENV)/.installed model build
	scripts/build-peer.sh
	$(if $(findstring --draft-model,$(BENCH_ARGS)),$(MAKE) --no-print-directory model-q8)
	$(VENV)/bin/python bench/speed.py --daemon $(BIN) --peer peer/llama-server \
		$(if $(filter command line environment,$(origin MODEL)),--model $(MODEL)) $(BENCH_ARGS)

# Soak: inferloopd (2 slots, a queue of 4) under chat and completions, streamed and not,
# json_schema, forced tool calls, dropped streams, bursts past the queue and /metrics scrapes
# at a steady SOAK_RATE, sampled every 10 s; see docs/benchmarks.md#soak. SOAK_ARGS adds flags
# (--warmup 15m, --sample-every 10, --pause-while /tmp/QUIET, --base-url URL --pid PID).
SOAK_DURATION ?= 2h
SOAK_RATE ?= 1
SOAK_ARGS ?=
.PHONY: soak soak-smoke
soak: $(VENV)/.installed model build
	$(VENV)/bin/python bench/soak.py --daemon $(BIN) --model $(MODEL) --duration $(SOAK_DURATION) \
		--rate $(SOAK_RATE) --out out/soak $(SOAK_ARGS)

soak-smoke: $(VENV)/.installed model build
	$(VENV)/bin/python bench/soak.py --daemon $(BIN) --model $(MODEL) --duration 5m \
		--rate $(SOAK_RATE) --out out/soak-smoke $(SOAK_ARGS)

# Boxes behind vLLM's router: bench/lan.py starts the boxes and a vllm-router per policy on
# this machine; see docs/benchmarks.md#boxes-behind-a-router-make-lan-demo. LAN_ARGS adds flags (--boxes, --policies,
# --clients, --requests, --faults kill,rejoin,thermal,drain, --fault-policy). The router is
# the PyPI wheel (a Python launcher around the Rust core), pinned, in its own venv.
LAN_ARGS ?=
.PHONY: lan-demo lan-demo-smoke
# A venv that already holds the pinned version (e.g. installed by hand from the wheel) is kept.
$(ROUTER_STAMP):
	if ! $(ROUTER_VENV)/bin/python -m pip show vllm-router 2>/dev/null | grep -x 'Version: $(VLLM_ROUTER_VERSION)' >/dev/null; then \
		$(PYTHON) -m venv $(ROUTER_VENV) && \
		$(ROUTER_VENV)/bin/python -m pip install --disable-pip-version-check -q vllm-router==$(VLLM_ROUTER_VERSION); \
	fi
	touch $@

.PHONY: router-venv
router-venv: $(ROUTER_STAMP)

# The wheels a gateway image installs vllm-router from (the spec's [gateway] wheels; the
# image tests' gateway build): vllm-router and its dependencies for this machine's
# architecture and Python. For another box, pip download with --platform and
# --python-version (docs/lan.md#a-gateway-image).
ROUTER_WHEELS := out/router-wheels
ROUTER_WHEELS_STAMP := $(ROUTER_WHEELS)/.downloaded-$(VLLM_ROUTER_VERSION)
$(ROUTER_WHEELS_STAMP):
	$(PYTHON) -m pip download --isolated --disable-pip-version-check -q --only-binary=:all: \
		-d $(ROUTER_WHEELS) vllm-router==$(VLLM_ROUTER_VERSION)
	touch $@

# The same for an aarch64 box (Jetson Orin, Debian arm64) with CPython 3.11 and glibc 2.28 or
# later: PyPI has vllm-router's manylinux_2_28_aarch64 wheel and every dependency's.
ROUTER_WHEELS_ARM64 := out/router-wheels-aarch64
ROUTER_WHEELS_ARM64_STAMP := $(ROUTER_WHEELS_ARM64)/.downloaded-$(VLLM_ROUTER_VERSION)
$(ROUTER_WHEELS_ARM64_STAMP):
	$(PYTHON) -m pip download --isolated --disable-pip-version-check -q --only-binary=:all: \
		--platform manylinux_2_28_aarch64 --platform manylinux2014_aarch64 \
		--python-version 3.11 --implementation cp -d $(ROUTER_WHEELS_ARM64) vllm-router==$(VLLM_ROUTER_VERSION)
	touch $@

.PHONY: router-wheels
router-wheels: $(ROUTER_WHEELS_STAMP) $(ROUTER_WHEELS_ARM64_STAMP)

lan-demo: $(ROUTER_STAMP) model build
	python3 bench/lan.py --daemon $(BIN) --model $(MODEL) --router $(ROUTER_VENV)/bin/vllm-router $(LAN_ARGS)

# Two boxes, round_robin and cache_aware, the kill, rejoin and drain cases under load; exits
# non-zero when a fault target fails (TTFT and hit rate are printed, not judged). ~2 minutes.
# The faults run under round_robin: under cache_aware a rejoined box gets work only when a
# prompt the other box has not cached arrives, which 4 clients on a slow machine may not send
# within the 5 s target (1.4-5.7 s measured); `make lan-demo` runs them under cache_aware.
lan-demo-smoke: $(ROUTER_STAMP) model build
	python3 bench/lan.py --smoke --boxes 2 --policies round_robin cache_aware --clients 4 \
		--requests 4 --faults kill,rejoin,drain --fault-policy round_robin --kill-hold-s 10 \
		--daemon $(BIN) --model $(MODEL) --router $(ROUTER_VENV)/bin/vllm-router \
		--out bench/results/lan-smoke.json $(LAN_ARGS)

# bench/prefix.py's plumbing against a stand-in daemon (bench/prefix_fake.py): seconds, no model.
bench-prefix-smoke:
	python3 bench/prefix_fake.py --smoke

kernels-check:
	scripts/kernels-check.sh

# The CUDA path on a machine without a GPU: every kernel compiled for this CPU behind a
# stand-in libcuda (the crate inferloop-cuda-sim, cuda-kernels/sim/), then the kernel tests
# in both thread orders, the daemon's CUDA forward pass, golden and a served request on
# --device cuda, each against the CPU twins (~3 minutes). CI runs it with SIM_ORDERS=none (its
# device phase runs the tests in one order), make check-long in both orders. `make cuda-sim`
# only builds it, into out/cuda-sim/.
.PHONY: cuda-sim cuda-sim-test
cuda-sim:
	cargo build --release $(LOCKED) --workspace --bin cuda-sim
	target/release/cuda-sim --out out/cuda-sim

cuda-sim-test: $(VENV)/.installed model-q8
	LOCKED=$(LOCKED) BIN=$(BIN) MODEL_Q8=$(MODEL_Q8) PY=$(VENV)/bin/python scripts/cuda-sim-check.sh

# The twins' tests cross-built for aarch64 and run under qemu-user: the NEON paths, bit for
# bit against scalar (needs the cross toolchain of `make cross`; minutes, not in CI).
.PHONY: kernels-test-aarch64
kernels-test-aarch64:
	scripts/kernels-aarch64.sh

# What scripts/device-check.sh needs on a GPU machine without a toolchain: gpu-preflight and
# q8-bench (with the thermal reading), the kernel test executables (the emulator's own live in
# inferloop-cuda-sim and need a C++ compiler), native_decode, the daemon's test binary, and
# kernels/ (sm_87 and sm_90 cubins, PTX 8.2) from kernels-check (TARGET= cross-builds for a
# Jetson). kernels/ is the layout the daemon looks for next to its binary, in
# INFERLOOP_KERNELS_DIR or in /usr/lib/inferloop/kernels.
TARGET ?=
# The whole workspace (see clippy's note above); a cross build has nothing to reuse.
BUNDLE_SCOPE = $(if $(TARGET),-p inferloop-kernels -p inferloopd --target $(TARGET),--workspace)
device-bundle: kernels-check
	rm -rf out/device && mkdir -p out/device/tests out/device/kernels out/device/daemon
	cargo test --release $(LOCKED) $(BUNDLE_SCOPE) --no-run --message-format=json > out/device/.cargo-tests.json
	scripts/pick-test-executables.py inferloop-kernels out/device/tests < out/device/.cargo-tests.json
	scripts/pick-test-executables.py inferloopd out/device/daemon --lib-only inferloopd-lib < out/device/.cargo-tests.json
	rm out/device/.cargo-tests.json
	# q8-bench and gpu-preflight read the thermal state: the daemon turns the kernels' feature on.
	cargo build --release $(LOCKED) $(BUNDLE_SCOPE) --bin q8-bench --bin gpu-preflight --example native_decode
	cp target/$(if $(TARGET),$(TARGET)/)release/examples/native_decode out/device/daemon/
	cp target/$(if $(TARGET),$(TARGET)/)release/q8-bench target/$(if $(TARGET),$(TARGET)/)release/gpu-preflight scripts/device-check.sh out/device/
	cp -r out/kernels/sm_* out/kernels/ptx out/device/kernels/
	du -sh out/device

# The bundle and scripts/device-check.sh dry-run here on the CUDA emulator (QUICK=1: small
# shapes, few tokens), so that the script a lent GPU runs has run once end to end (~3 min);
# out/device-check-sim/summary.json. The rehearsal adds the two runs that must fail closed.
.PHONY: device-check-sim device-check-rehearse
device-check-sim: device-bundle cuda-sim
	rm -rf out/device-check-sim
	LD_LIBRARY_PATH=$(abspath out/cuda-sim/lib) PTX_DIR=$(abspath out/cuda-sim/modules) QUICK=1 \
	  OUT=$(abspath out/device-check-sim) out/device/device-check.sh

device-check-rehearse: device-bundle cuda-sim
	scripts/device-check-rehearse.sh

DEVICE ?= cpu
kernel-bench:
	cargo build --release $(LOCKED) --workspace --bin q8-bench
	mkdir -p out/kernels
	target/release/q8-bench --device $(DEVICE) --json out/kernels/bench-$(DEVICE).json $(BENCH_ARGS)

# The decode kernels' DRAM bandwidth as a ratio to a copy kernel, on GPGPU-Sim with an
# Orin-NX-shaped configuration (docs/native-and-cuda.md). The simulator's source is in no
# package registry: GPGPUSIM_SRC is a git checkout of accel-sim/gpgpu-sim_distribution, built
# once into ~/.cache/inferloop/gpgpusim. Not in CI. QUICK=1: a few minutes; the full run: see
# the docs.
.PHONY: gpu-sim-bench
gpu-sim-bench:
	GPGPUSIM_SRC=$(GPGPUSIM_SRC) scripts/gpu-sim-bench.sh

# The GGUF reader against a million seeded mutations of the real header: no panic, no
# allocation beyond the input's size (~30 minutes on 2 cores; make test runs 10,000).
.PHONY: fuzz-gguf
fuzz-gguf: model
	GGUF_MUTATIONS=1000000 cargo test --release $(LOCKED) --workspace --test mutation -- --nocapture

# Coverage-guided fuzzing with libFuzzer (cargo fuzz; fuzz/, docs/fuzzing.md): request
# bodies through validation, hostile chat templates, the tool-call parsers whole vs
# trickled, the SSE framing, the GGUF reader, the OTA agent's DDI replies.
#   make fuzz        every target for FUZZ_RUNS executions, one after another (not in CI;
#                    FUZZ_MAX_TIME=S caps each target's seconds) -> out/fuzz/summary.txt
#   make fuzz-smoke  every target for FUZZ_SMOKE_RUNS executions or 20 s (in check-long)
# FUZZ_TARGETS="template sse" picks targets. Needs cargo-fuzz (scripts/install-deps.sh).
FUZZ_RUNS ?= 1000000
FUZZ_MAX_TIME ?= 0
FUZZ_SMOKE_RUNS ?= 50000
.PHONY: fuzz fuzz-smoke fuzz-deps
fuzz-deps:
	scripts/install-deps.sh --fuzz

fuzz: fuzz-deps
	FUZZ_RUNS=$(FUZZ_RUNS) FUZZ_MAX_TIME=$(FUZZ_MAX_TIME) scripts/fuzz.sh

fuzz-smoke: fuzz-deps
	FUZZ_BUILD=dev FUZZ_RUNS=$(FUZZ_SMOKE_RUNS) FUZZ_MAX_TIME=20 FUZZ_OUT=out/fuzz-smoke scripts/fuzz.sh

# The checks CI leaves out to stay near 40 minutes (docs/testing.md): libFuzzer on every
# target, the 5-minute soak, the emulator's GPU tests in both thread orders, the image booted
# under QEMU with A/B updates inside it. Root; ~20 minutes on 2 cores after `make build`.
.PHONY: check-long
check-long:
	$(MAKE) --no-print-directory fuzz-smoke
	$(MAKE) --no-print-directory soak-smoke
	$(MAKE) --no-print-directory cuda-sim-test
	$(MAKE) --no-print-directory vm-test

fmt:
	cargo fmt --all
	cargo fmt --manifest-path fuzz/Cargo.toml --all

clippy:
	cargo clippy --workspace --all-targets --release $(LOCKED) -- -D warnings
	$(CLIPPY_FUZZ)

# Keeps models/ (a re-download is ~100 MB); `rm -rf models` for that.
clean:
	cargo clean
	rm -rf $(VENV) bench/results peer

# --- Images for the board (issue 6) ------------------------------------------------------
#
#   make cross       cross-build inferloopd (-> $(CROSS_BIN)), inferloop-qual and inferloop-ota for aarch64 (Orin)
#   make cross-test  run it under qemu: --version and one short generation
#   make image       build $(IMAGE_SPEC) into $(IMAGE_OUT)/ and verify it
#
# The cross build is not part of `make test` (minutes of llama.cpp C++ for another CPU).

CROSS_TARGET := aarch64-unknown-linux-gnu
CROSS_BIN    := target/$(CROSS_TARGET)/release/inferloopd
IMAGE_SPEC   ?= image/examples/orin-nx-16gb.toml
IMAGE_OUT    ?= out/image
IMAGE_BIN    := target/release/inferloop-image
# Every timestamp in the image: the last commit's time, so rebuilding a commit gives the
# same bytes. Override to rebuild an older image exactly.
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)

.PHONY: cross cross-test image image-tool base-rootfs ota-keys bundle

cross:
	scripts/cross-build.sh

$(CROSS_BIN):
	scripts/cross-build.sh

cross-test: model $(CROSS_BIN)
	scripts/cross-test.sh

image-tool: deps
	cargo build --release $(LOCKED) --workspace --bin inferloop-image

base-rootfs:
	scripts/make-base-rootfs.sh out/base-rootfs

# The Orin example bakes $(MODEL_Q8), pinned by its SHA-256 (model-q8 makes it first), and
# installs the shipped kernels from kernels-check.
image: image-tool base-rootfs $(CROSS_BIN) model-q8 kernels-check
	SOURCE_DATE_EPOCH=$(SOURCE_DATE_EPOCH) $(IMAGE_BIN) build --spec $(IMAGE_SPEC) --out $(IMAGE_OUT)
	$(IMAGE_BIN) verify --manifest $(IMAGE_OUT)/manifest.json
	$(IMAGE_BIN) inspect $(IMAGE_OUT)/manifest.json

# RAUC update bundles (issue 15). ota-keys keeps existing keys (scripts/ota-keys.sh --force
# replaces them). $(OTA_SPEC) names $(OTA_KEYS)/ca.cert.pem as its keyring by a relative
# path: with other keys, edit the spec too. BUNDLE_FORMAT=plain for kernels without dm-verity.
OTA_KEYS      ?= out/ota-keys
OTA_SPEC      ?= image/examples/orin-nx-16gb-ota.toml
OTA_IMAGE_OUT ?= out/image-ota
BUNDLE        ?= out/bundle/inferloop-jetson-orin-nx-16gb.raucb
BUNDLE_FORMAT ?= verity

ota-keys:
	scripts/ota-keys.sh $(OTA_KEYS)

bundle: image-tool base-rootfs $(CROSS_BIN) ota-keys model-q8 kernels-check
	SOURCE_DATE_EPOCH=$(SOURCE_DATE_EPOCH) $(IMAGE_BIN) build --spec $(OTA_SPEC) --out $(OTA_IMAGE_OUT)
	$(IMAGE_BIN) verify --manifest $(OTA_IMAGE_OUT)/manifest.json
	$(IMAGE_BIN) bundle --spec $(OTA_SPEC) --image $(OTA_IMAGE_OUT) --format $(BUNDLE_FORMAT) \
	  --cert $(OTA_KEYS)/signing.cert.pem --key $(OTA_KEYS)/signing.key.pem \
	  --keyring $(OTA_KEYS)/ca.cert.pem --out $(BUNDLE) --force
	$(IMAGE_BIN) inspect $(BUNDLE) --keyring $(OTA_KEYS)/ca.cert.pem

# --- Qualification (issue 5) ---------------------------------------------------------------
#
#   make qual   build release, run all 385 checks in spawn mode on $(MODEL) (the suite starts
#               every daemon it needs), write report.{json,md,html} into $(QUAL_OUT)/
#
# QUAL_ARGS passes flags to inferloop-qual, e.g. QUAL_ARGS="--filter stream --jobs 2".
# Exit status: 0 nothing failed (skips are explained in the report), 1 a case failed.

QUAL_OUT  ?= out/qual
QUAL_ARGS ?=
QUAL_BIN  := target/release/inferloop-qual

.PHONY: qual

qual: deps model
	cargo build --release $(LOCKED) --workspace --bin inferloopd --bin inferloop-qual
	$(QUAL_BIN) --spawn $(BIN) --model $(MODEL) --report $(QUAL_OUT) $(QUAL_ARGS)

# The same cases against llama.cpp's llama-server (scripts/build-peer.sh builds it into
# peer/), started on a free loopback port with the default model (with `--embeddings --pooling
# mean`, without which it answers embeddings with a 501) and attached to with
# --base-url: cases that need more than OpenAI's API are skipped with the reason. Writes
# $(QUAL_PEER_OUT)/report.{json,md,html}, and compare.md (both tallies, group by group) when
# $(QUAL_OUT)/report.json exists. Failed cases are findings about the peer, not a broken
# build: only a suite that could not run (exit 2) fails the target.
QUAL_PEER_OUT ?= out/qual-peer

.PHONY: qual-peer
qual-peer: deps model
	scripts/build-peer.sh
	cargo build --release $(LOCKED) --workspace --bin inferloop-qual
	mkdir -p $(QUAL_PEER_OUT)
	port=$$($(PYTHON) -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'); \
	peer/llama-server -m $(MODEL) --host 127.0.0.1 --port $$port -t 2 -np 4 -c 8192 --no-webui --jinja \
	  --embeddings --pooling mean > $(QUAL_PEER_OUT)/llama-server.log 2>&1 & pid=$$!; \
	trap 'kill $$pid 2>/dev/null; wait $$pid 2>/dev/null' EXIT; \
	rc=0; $(QUAL_BIN) --base-url http://127.0.0.1:$$port --report $(QUAL_PEER_OUT) $(QUAL_ARGS) || rc=$$?; \
	if [ -f $(QUAL_OUT)/report.json ]; then \
	  $(QUAL_BIN) compare $(QUAL_OUT)/report.json $(QUAL_PEER_OUT)/report.json | tee $(QUAL_PEER_OUT)/compare.md; fi; \
	[ $$rc -le 1 ]

# The native backend (CPU twin) on the Q8_0 model: the whole qualification suite and the
# `openai` client tests, every daemon started with --backend native --device cpu.
.PHONY: test-native
test-native: $(VENV)/.installed model-q8
	cargo build --release $(LOCKED) --workspace --bin inferloop-qual
	$(QUAL_BIN) --spawn $(BIN) --model $(MODEL_Q8) --serve-args "--backend native --device cpu" \
	  --report out/qual-native $(QUAL_ARGS)
	INFERLOOPD=$(abspath $(BIN)) INFERLOOP_TEST_MODEL=$(abspath $(MODEL_Q8)) \
	  INFERLOOPD_ARGS="--backend native --device cpu" $(VENV)/bin/pytest -q -rs --durations=12 tests/python

# --- A/B updates with RAUC (issue 15) -----------------------------------------------------
#
#   make ota-test   tests/ota/ with the real RAUC 1.8: a system D-Bus on a socket, `rauc service`
#                   in its own mount namespace, two loop-device slots and a fake nvbootctrl
#                   (needs root; ~2 minutes). OTA_KILL_RUNS sets the kill -9 repetitions (3).
#   make ota-kill   only the kill -9 mid-write case, $(OTA_KILL_RUNS_MANY) times
#   make ota-demo   install -> reboot -> mark-good on the emulated board, printing `rauc status`
#
# OTA_WORK=DIR keeps the keys, images and bundles in DIR instead of a temporary directory.

OTA_KILL_RUNS ?= 3
OTA_KILL_RUNS_MANY ?= 20

.PHONY: ota-test ota-kill ota-demo

ota-test: image-tool $(VENV)/.installed
	mkdir -p out/ota-test
	cd tests/ota && OTA_REQUIRE=1 OTA_KILL_RUNS=$(OTA_KILL_RUNS) OTA_REPORT=$(abspath out/ota-test/timings.txt) \
	  $(abspath $(VENV))/bin/pytest -q -rs -p no:cacheprovider test_ota.py
	cat out/ota-test/timings.txt

ota-kill: image-tool $(VENV)/.installed
	mkdir -p out/ota-test
	cd tests/ota && OTA_REQUIRE=1 OTA_KILL_RUNS=$(OTA_KILL_RUNS_MANY) OTA_REPORT=$(abspath out/ota-test/kill-timings.txt) \
	  $(abspath $(VENV))/bin/pytest -q -rs -s -p no:cacheprovider -k test_f_kill test_ota.py
	cat out/ota-test/kill-timings.txt

ota-demo: image-tool
	rm -rf out/ota-demo
	$(PYTHON) tests/ota/ota.py demo out/ota-demo

# --- Fleet rollouts (issue 17) -------------------------------------------------------------
#
#   make fleet-test  tests/fleet/: the inferloop-ota agent on simulated boxes (RAUC on loop
#                    devices, as in ota-test) against a real goosebit from PyPI: rollout ->
#                    reboot -> health -> success, a tampered artifact, refused bundles, a
#                    server kill -9 mid-download, ten boxes at once (root; ~3 minutes)
#   make fleet-demo  goosebit + two bundles + three boxes, a rollout of the newer one; the
#                    server's view of the devices in out/fleet-demo/devices.json
#
# goosebit lives in .venv-goosebit (scripts/goosebit.sh install; Python >= 3.11).

.PHONY: ota-agent goosebit fleet-test fleet-demo

ota-agent: deps
	cargo build --release $(LOCKED) --workspace --bin inferloop-ota

goosebit:
	scripts/goosebit.sh install

fleet-test: image-tool ota-agent goosebit $(VENV)/.installed
	mkdir -p out/fleet-test
	cd tests/fleet && OTA_REQUIRE=1 FLEET_REPORT=$(abspath out/fleet-test/timings.txt) \
	  $(abspath $(VENV))/bin/pytest -q -rs -p no:cacheprovider .
	cat out/fleet-test/timings.txt

fleet-demo: image-tool ota-agent goosebit
	$(PYTHON) tests/fleet/fleet.py demo out/fleet-demo

# --- The image booted under QEMU (issue 16) ------------------------------------------------
#
#   make image-debian  $(VM_SPEC): a Debian bookworm root built by mmdebstrap (cached in
#                      out/debian-cache/), the overlay, the daemon -> $(VM_IMAGE)/ with
#                      rootfs.squashfs, vmlinuz, initrd.img, manifest.json, debian-packages.txt
#   make vm-boot       boot it under QEMU (TCG) and check systemd, the read-only root, the
#                      daemon's sandbox and watchdog, the qualification smoke set from the host
#   make vm-test       vm-boot plus RAUC updates inside the VM over HTTP (verity bundles): a
#                      bad update rolled back, kill -9 of QEMU mid-install, a retry marked good
#                      (root)
#
# VM_ARCH=amd64 (the default, what CI runs) boots the x86-64 daemon `make build` made in a
# q35 machine; VM_ARCH=arm64 boots the aarch64 one from `make cross` in QEMU's virt machine
# (the cross build alone: 23 CPU-minutes, 43 minutes on a busy 2-core box; not in CI).
# Timings go to $(VM_WORK)/timings-*.txt, serial logs to $(VM_WORK)/serial-*.log.

VM_ARCH    ?= amd64
VM_SPEC    ?= image/examples/qemu-virt-$(VM_ARCH).toml
VM_IMAGE   ?= out/vm-image-$(VM_ARCH)
VM_BUNDLES ?= out/vm-bundles-$(VM_ARCH)
VM_WORK    ?= out/vm-$(VM_ARCH)
# The smoke set vm-boot runs from the host; VM_SMOKE=rootfs/etc/inferloop/health-smoke.txt
# runs the full one (19 cases: ~2 minutes under amd64 TCG).
VM_SMOKE   ?= rootfs-qemu-virt/etc/inferloop/health-smoke-tcg.txt
ifeq ($(VM_ARCH),arm64)
VM_DAEMON  := $(CROSS_BIN)
else
VM_DAEMON  := build
endif

.PHONY: vm-deps image-debian vm-bundles vm-boot vm-test qual-tool

vm-deps:
	scripts/install-vm-deps.sh $(VM_ARCH)

qual-tool: deps
	cargo build --release $(LOCKED) --workspace --bin inferloop-qual

image-debian: vm-deps image-tool ota-keys $(VM_DAEMON)
	SOURCE_DATE_EPOCH=$(SOURCE_DATE_EPOCH) $(IMAGE_BIN) build --spec $(VM_SPEC) --out $(VM_IMAGE) \
	  --no-tarball --base-cache out/debian-cache
	$(IMAGE_BIN) verify --manifest $(VM_IMAGE)/manifest.json

vm-bundles: image-debian
	SOURCE_DATE_EPOCH=$(SOURCE_DATE_EPOCH) scripts/vm-bundles.sh $(VM_SPEC) $(VM_BUNDLES) $(OTA_KEYS)

vm-boot: image-debian model qual-tool
	$(PYTHON) tests/vm/vm.py boot --image $(VM_IMAGE) --work $(VM_WORK) --smoke $(VM_SMOKE)
	cat $(VM_WORK)/timings-boot.txt

vm-test: vm-bundles model qual-tool
	$(PYTHON) tests/vm/vm.py test --image $(VM_IMAGE) --bundles $(VM_BUNDLES) --work $(VM_WORK) \
	  --smoke $(VM_SMOKE)
	cat $(VM_WORK)/timings-test.txt
