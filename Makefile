# fp8lab: two commands do everything on a fresh machine.
#   make book   -> virtual environment, requirements, fp8lab, the rendered book in _build/html
#   make test   -> the CPU lane: lint, the strict book build, unit tests, every notebook on the smoke preset
#   make lab    -> JupyterLab on lab/, a working copy of notebooks/ (git-ignored; made once, never
#                  overwritten), in the same .venv, with the project's kernel ("Python (fp8lab)")
#   make doctor -> the pre-flight (python -m fp8lab.doctor) inside .venv, TE pointed at PyTorch's cuDNN
#   make page-check -> the rendered pages at 1280 px in headless Chromium (part of make test;
#                      skipped, with a line saying so, where no Chromium is installed)
# On a GPU box with Transformer Engine:
#   make gpu-lane -> execute every chapter in place on the full preset and stamp it
# A room without network:
#   make wheelhouse        -> (on a machine with network) every wheel a GPU box needs, in ./wheelhouse
#   make te-wheel          -> (on a GPU box with the CUDA toolkit) TE's PyTorch extension built
#                             from its source in ./wheelhouse, into ./wheelhouse
#   make install-offline   -> (on the GPU box) .venv from ./wheelhouse alone: no network used
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

.PHONY: book test lint unit notebooks book-strict page-check gpu-lane check-stamps lab kernel clean \
	doctor wheelhouse te-wheel install-offline

# The GPU stack the chapters were stamped with (their metadata records it), for the wheelhouse.
GPU_TORCH ?= torch==2.11.0
GPU_INDEX ?= https://download.pytorch.org/whl/cu130
TE_VERSION ?= 2.20.2
WHEELHOUSE ?= wheelhouse
# Wheels for another machine than this one, e.g.
#   WHEEL_TARGET="--python-version 3.12 --platform manylinux_2_28_x86_64 --only-binary=:all:"
WHEEL_TARGET ?=
# Transformer Engine loads cuDNN from CUDNN_PATH/CUDNN_HOME and the system's library path before
# PyTorch's own: where PyTorch's (pip's nvidia-cudnn package) is installed, point both at it, over
# any value already set, and put its lib/ first on LD_LIBRARY_PATH, so that one cuDNN is in the
# process (book/gpu-box.md, "One cuDNN per process"). A machine image with a system cuDNN older
# than PyTorch's (9.14 under 9.19) otherwise fails make doctor.
CUDNN_ENV = _c=$$($(BIN)/python -c "import nvidia.cudnn as c; print(list(c.__path__)[0])" 2>/dev/null); \
	if [ -n "$$_c" ]; then export CUDNN_PATH="$$_c" CUDNN_HOME="$$_c" \
	  LD_LIBRARY_PATH="$$_c/lib$${LD_LIBRARY_PATH:+:$$LD_LIBRARY_PATH}"; fi

$(BIN)/.installed: requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV_FLAGS) $(VENV)
	$(if $(VENV_FLAGS),$(PYTHON) tools/machine_packages.py $(VENV))
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

# Participants work on copies: lab/ is made from notebooks/ once and never overwritten, so a
# run's autosave never touches the committed chapters (the grader reads neither).
lab: kernel
	@mkdir -p lab && cp -rn notebooks/. lab/
	$(CUDNN_ENV); $(BIN)/jupyter lab --notebook-dir=lab

# The pre-flight, inside the .venv (no install: it reports what is there).
doctor:
	@test -x $(BIN)/python || { echo "doctor: no $(VENV) here: run make book or make install-offline first"; exit 2; }
	@$(CUDNN_ENV); $(BIN)/python -m fp8lab.doctor $(DOCTOR_ARGS)

# On a machine with network: every wheel a GPU box needs (PyTorch for CUDA 13.0 and its NVIDIA
# libraries, TE's core wheels and its PyTorch extension's source, the notebooks' libraries,
# the tools TE's build needs, and fp8lab's own build backend), into $(WHEELHOUSE)/.
wheelhouse:
	mkdir -p $(WHEELHOUSE)
	$(PYTHON) -m pip download -d $(WHEELHOUSE) $(WHEEL_TARGET) "$(GPU_TORCH)" --index-url $(GPU_INDEX)
	$(PYTHON) -m pip download -d $(WHEELHOUSE) $(WHEEL_TARGET) "$(GPU_TORCH)" \
	  "transformer-engine[core-cu13]==$(TE_VERSION)" -r workshop/requirements-lab.txt \
	  "jupyterlab>=4.2" setuptools wheel pybind11 ninja nvidia-cudnn-frontend \
	  --extra-index-url $(GPU_INDEX)
	$(PYTHON) -m pip download -d $(WHEELHOUSE) --no-deps --no-binary=:all: \
	  "transformer-engine-torch==$(TE_VERSION)"
	@ls $(WHEELHOUSE) | wc -l | xargs echo "wheelhouse: files:"; du -sh $(WHEELHOUSE)

# On a GPU box with the CUDA toolkit 13 (nvcc), no network: TE's PyTorch extension, built from
# the source the wheelhouse holds against the wheelhouse's torch, into the wheelhouse (once per
# stack; copy the wheel to the other boxes' wheelhouses). Build isolation is off, so the build
# tools come from the wheelhouse first, and CUDNN_PATH points at PyTorch's cuDNN before the build.
# TE_CUDA_ARCHS: the GPUs' compute capabilities (90: H100/H200; "89;90" adds L4/L40S/RTX 4090).
TE_CUDA_ARCHS ?= 90
te-wheel:
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV_FLAGS) $(VENV)
	$(if $(VENV_FLAGS),$(PYTHON) tools/machine_packages.py $(VENV))
	$(BIN)/python -c "import torch" 2>/dev/null || \
	  $(BIN)/python -m pip install -q --no-index --find-links $(WHEELHOUSE) "$(GPU_TORCH)"
	$(BIN)/python -m pip install -q --no-index --find-links $(WHEELHOUSE) setuptools wheel \
	  pybind11 ninja nvidia-cudnn-frontend pydantic packaging
	$(BIN)/python -m pip install -q --no-index --find-links $(WHEELHOUSE) --no-deps \
	  "transformer-engine==$(TE_VERSION)" "transformer-engine-cu13==$(TE_VERSION)"
	$(CUDNN_ENV); NVTE_FRAMEWORK=pytorch NVTE_CUDA_ARCHS="$(TE_CUDA_ARCHS)" MAX_JOBS=$${MAX_JOBS:-8} \
	  $(BIN)/python -m pip wheel --no-build-isolation --no-deps --no-index \
	  --find-links $(WHEELHOUSE) -w $(WHEELHOUSE) "transformer-engine-torch==$(TE_VERSION)"

# On the GPU box, no network: .venv from the wheelhouse alone. SYSTEM_SITE=1 reuses a torch the
# machine already has (an NVIDIA container, a prepared image, also one whose torch is in a venv
# of its own: tools/machine_packages.py links it); LAB_UI=0 leaves JupyterLab out
# (notebooks then run headless, as tools/setup_bare.py does).
LAB_UI ?= 1
# TE's three wheels without their export-only dependencies (ONNX, onnxscript, einops), then
# what importing TE and training with it need.
TE_WHEELS = --no-deps "transformer-engine==$(TE_VERSION)" "transformer-engine-cu13==$(TE_VERSION)" \
	"transformer-engine-torch==$(TE_VERSION)"
TE_NEEDS = pydantic nvdlfw-inspect packaging
install-offline:
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV_FLAGS) $(VENV)
	$(if $(VENV_FLAGS),$(PYTHON) tools/machine_packages.py $(VENV))
	$(BIN)/python -c "import setuptools" 2>/dev/null || \
	  $(BIN)/python -m pip install -q --no-index --find-links $(WHEELHOUSE) setuptools
	$(BIN)/python -c "import torch" 2>/dev/null || \
	  $(BIN)/python -m pip install -q --no-index --find-links $(WHEELHOUSE) "$(GPU_TORCH)"
	$(BIN)/python -m pip install -q --no-index --find-links $(WHEELHOUSE) $(TE_WHEELS)
	$(BIN)/python -m pip install -q --no-index --find-links $(WHEELHOUSE) --no-build-isolation \
	  $(TE_NEEDS) -r workshop/requirements-lab.txt -e . $(if $(filter 1,$(LAB_UI)),"jupyterlab>=4.2",)
	$(BIN)/python -m ipykernel install --sys-prefix --name fp8lab --display-name "Python (fp8lab)" >/dev/null
	@echo "installed from $(WHEELHOUSE) alone; next: make doctor"

check-stamps: $(BIN)/.installed
	$(BIN)/python -m tools.lane check

clean:
	rm -rf _build $(VENV)
