# InferLoop: build, run and test the inferloopd daemon.
#
#   make run    install deps, fetch the model, build, start the server
#   make test   fmt + clippy + Rust tests + Python (openai client) tests
#
# Variables you may override: MODEL, HOST, PORT, ARGS (extra serve flags),
# BENCH_ARGS (extra bench.py flags), PYTHON.

SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

# rustup installs into ~/.cargo/bin, which a fresh shell may not have on PATH.
export PATH := $(HOME)/.cargo/bin:$(PATH)

PYTHON ?= python3
MODEL  ?= models/SmolLM2-135M-Instruct.Q4_1.gguf
HOST   ?= 127.0.0.1
PORT   ?= 8080
ARGS   ?=
BENCH_ARGS ?=

BIN   := target/release/inferloopd
VENV  := .venv
# --locked only once Cargo.lock exists (it is committed; this keeps a fresh
# checkout without one buildable).
LOCKED := $(if $(wildcard Cargo.lock),--locked,)

# Tests load the real model; they find it through this variable.
INFERLOOP_TEST_MODEL ?= $(abspath $(MODEL))
export INFERLOOP_TEST_MODEL

.PHONY: help deps model build run test pytest bench fmt clippy clean venv

help:
	@echo "InferLoop make targets:"
	@echo "  run      deps + model + build, then serve on http://$(HOST):$(PORT) (ARGS= adds flags)"
	@echo "  test     fmt check, clippy, cargo test (release), Python client tests"
	@echo "  deps     install system packages / check the Rust toolchain"
	@echo "  model    download and verify $(MODEL)"
	@echo "  build    cargo build --release"
	@echo "  pytest   Python tests with the official openai client (in $(VENV))"
	@echo "  bench    TTFT and decode throughput benchmark -> bench/results/latest.json"
	@echo "  fmt, clippy, clean"

deps:
	scripts/install-deps.sh

model:
	scripts/fetch-model.sh

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
# minutes on 2 cores). It lints the same code.
test: deps model
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets --release $(LOCKED) -- -D warnings
	cargo test --workspace --release $(LOCKED)
	$(MAKE) --no-print-directory pytest

# The venv is rebuilt when the pinned requirements change.
$(VENV)/.installed: tests/python/requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --disable-pip-version-check -q -r tests/python/requirements.txt
	touch $@

venv: $(VENV)/.installed

pytest: $(VENV)/.installed model build
	INFERLOOPD=$(abspath $(BIN)) $(VENV)/bin/pytest -q tests/python

bench: $(VENV)/.installed model build
	$(VENV)/bin/python bench/bench.py --daemon $(BIN) --model $(MODEL) $(BENCH_ARGS)

fmt:
	cargo fmt --all

clippy:
	cargo clippy --workspace --all-targets --release $(LOCKED) -- -D warnings

# Keeps models/ (a re-download is ~100 MB); `rm -rf models` for that.
clean:
	cargo clean
	rm -rf $(VENV) bench/results
