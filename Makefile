# unitok: every target sets up .venv on first use (pyproject.toml + constraints.txt).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install run run-gpt test test-compile bench bench-gpu claims lint notebooks lab clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]' -c constraints.txt
	touch $(STAMP)

install: $(STAMP)

# The main job: train a tiny CLIP on the built-in captioned digits, then classify the held-out
# scans zero-shot (with prompt templates never used as captions) and print the accuracy.
run: $(STAMP)
	$(BIN)/unitok fit --config configs/clip/digits.yaml
	$(BIN)/unitok test --config configs/clip/digits.yaml --ckpt_path last

# Train a tiny GPT on the built-in corpus, then continue a few prompts.
run-gpt: $(STAMP)
	$(BIN)/unitok fit --config configs/gpt/tiny.yaml
	$(BIN)/unitok sample --model runs/gpt_tiny/latest/pretrained --max_new_tokens 48 \
		--prompt "def main(" --prompt "class Parser" --strategy beam --num_beams 4
	$(BIN)/unitok sample --model runs/gpt_tiny/latest/pretrained --max_new_tokens 48 \
		--prompt "import os" --strategy sample --top_k 40 --top_p 0.95 --temperature 0.8

# The whole test suite (slow tests included), CPU only. -rs lists any skipped test with its
# reason; under CI=true a skipped test fails the run (tests/conftest.py).
test: $(STAMP)
	$(BIN)/python -m pytest -q -rs -p no:cacheprovider

# The compiled path through inductor (a C++ toolchain's compile warm-up per model, so not part
# of `make test`, which traces the same checks with the aot_eager backend).
test-compile: $(STAMP)
	UNITOK_COMPILE_BACKEND=inductor $(BIN)/python -m pytest -q -rs -p no:cacheprovider tests/unitok/test_compile.py tests/unitok/test_static_decode.py \
		tests/unitok/test_linear_cross_entropy.py

# Jupyter in .venv for the notebooks: `make notebooks` installs it, `make lab` opens them.
NB_STAMP := $(VENV)/.notebooks
$(NB_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev,notebooks]' -c constraints.txt
	touch $(NB_STAMP)

notebooks: $(NB_STAMP)
	@echo "Jupyter is installed in $(VENV): run 'make lab' or '$(BIN)/jupyter lab notebooks/'"

lab: $(NB_STAMP)
	$(BIN)/jupyter lab notebooks/

bench: $(STAMP)
	$(BIN)/python benchmarks/summary.py --threads 1
	$(BIN)/python benchmarks/tokenizer_vs_hf.py --threads 1
	$(BIN)/python benchmarks/bf16_vs_fp32.py --threads 1

# On a machine with a CUDA GPU (benchmarks/gpu.sh, logs in runs/bench-gpu): GPT-124M bf16 training
# MFU (eager and compiled) and generation against Hugging Face, the CUDA-only checks
# (benchmarks/cuda_checks.py), a Lightning fit in bf16-mixed, every family's table on cuda.
bench-gpu: $(STAMP)
	PYTHON=$(BIN)/python bash benchmarks/gpu.sh

# The lectures' claims over 3 seeds at a fixed small budget (benchmarks/claims.py): prints each
# claim's arms (mean ± std) and gap, writes runs/claims/claims.md for the README.
claims: $(STAMP)
	$(BIN)/python benchmarks/claims.py --jobs 2 --threads 1

lint: $(STAMP)
	$(BIN)/ruff check unitok tokenizers_mm tasks tests benchmarks

clean:
	rm -rf $(VENV) runs .pytest_cache
