# fp8lab: two commands do everything on a fresh machine.
#   make book   -> virtual environment, requirements, fp8lab, the rendered book in _build/html
#   make test   -> the CPU lane: lint, the strict book build, unit tests, every notebook on the smoke preset
#   make lab    -> JupyterLab on notebooks/ in the same .venv, with the project's kernel ("Python (fp8lab)")
#   make page-check -> the rendered pages at 1280 px in headless Chromium (part of make test;
#                      skipped, with a line saying so, where no Chromium is installed)
# On a GPU box with Transformer Engine:
#   make gpu-lane -> execute every chapter in place on the full preset and stamp it
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The virtual environment sees only what requirements.txt and pyproject.toml declare, so that an
# import nobody declared fails here, not on a reader's machine. SYSTEM_SITE=1 lets it see the
# system's packages instead: for a GPU container whose CUDA build of torch (and Transformer
# Engine) must be reused, e.g. `make book SYSTEM_SITE=1`.
SYSTEM_SITE ?=
VENV_FLAGS := $(if $(filter 1 yes true,$(SYSTEM_SITE)),--system-site-packages,)
# torch is installed only when none is importable (an existing CUDA torch is kept as it is).
# Where no local CPU wheel is available, add: TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu"
TORCH ?= torch==2.13.0
TORCH_PIP_ARGS ?=
PYTEST_WORKERS ?= 2
# The page check's browser: the first Chromium on PATH (CHROMIUM= turns the check off).
CHROMIUM ?= $(shell command -v chromium || command -v chromium-browser || command -v google-chrome)
# Strict by default: a tall expanded code cell or a scaled-down figure fails the check too.
# e.g. PAGE_CHECK_ARGS="--screenshots _build/page-shots --strict-code --strict-figures"
PAGE_CHECK_ARGS ?= --strict-code --strict-figures

.PHONY: book test lint unit notebooks book-strict page-check gpu-lane check-stamps lab kernel clean

$(BIN)/.installed: requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV_FLAGS) $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q "$(TORCH)" $(TORCH_PIP_ARGS)
	$(BIN)/python -m pip install -q -r requirements.txt -e ".[test]"
	touch $@

book: $(BIN)/.installed
	$(BIN)/jupyter-book build . -W -n --keep-going
	@echo "open _build/html/index.html"

book-strict: $(BIN)/.installed
	rm -rf _build
	$(BIN)/jupyter-book build . -W -n --keep-going

# Builds the book first where no build is there.
page-check: $(BIN)/.installed
	@if [ -z "$(CHROMIUM)" ]; then \
	  echo "page-check: NOT RUN: no Chromium found (looked for chromium, chromium-browser," \
	    "google-chrome); install one (apt-get install chromium) or set CHROMIUM=/path/to/it"; \
	else \
	  { test -f _build/html/index.html || $(BIN)/jupyter-book build . -W -n --keep-going; } && \
	  $(BIN)/python -m tools.page_check _build/html --browser "$(CHROMIUM)" $(PAGE_CHECK_ARGS); \
	fi

lint: $(BIN)/.installed
	$(BIN)/ruff check fp8lab tools tests

unit: $(BIN)/.installed
	FP8LAB_PRESET=smoke $(BIN)/python -m pytest -q -m "not gpu" tests

notebooks: $(BIN)/.installed
	FP8LAB_PRESET=smoke $(BIN)/python -m pytest -q --nbmake -n $(PYTEST_WORKERS) $$($(BIN)/python -m tools.lane list)

test: $(BIN)/.installed lint book-strict check-stamps
	@$(MAKE) --no-print-directory page-check
	FP8LAB_PRESET=smoke $(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --nbmake tests $$($(BIN)/python -m tools.lane list)

gpu-lane:
	$(PYTHON) -m tools.lane run $(NOTEBOOKS)

# The notebooks' kernel: the .venv's python, registered inside the .venv (nothing in ~/.local).
kernel: $(BIN)/.installed
	$(BIN)/python -m ipykernel install --sys-prefix --name fp8lab --display-name "Python (fp8lab)" >/dev/null
	@echo "kernel 'fp8lab' registered in $(VENV)"

lab: kernel
	$(BIN)/jupyter lab --notebook-dir=notebooks

check-stamps: $(BIN)/.installed
	$(BIN)/python -m tools.lane check

clean:
	rm -rf _build $(VENV)
