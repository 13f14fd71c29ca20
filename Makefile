# The two set-up commands in the README are `make demo` and `make test`. Each creates .venv when it
# is missing and installs ragrl into it (torch pinned to the 2.13.0 CPU build so no CUDA wheels are
# pulled on a CPU machine).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
SHARED ?= ../shared/data
STAMP  := $(VENV)/.installed

.PHONY: install demo quickstart test test-all lint bench clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e ".[dev]"
	@touch $(STAMP)

install: $(STAMP)

# The main job. Until `ragrl demo` exists it runs the retrieval quick-start on real HotpotQA data.
demo: quickstart

quickstart: $(STAMP)
	@test -d $(SHARED) || { echo "error: dataset samples not found at $(SHARED) (set SHARED=...)"; exit 2; }
	$(BIN)/ragrl data convert $(SHARED)/hotpotqa/leeyeezeee__benchfortir/test.jsonl --out runs/quickstart/hotpotqa
	$(BIN)/ragrl data stats runs/quickstart/hotpotqa/questions.jsonl
	$(BIN)/ragrl index runs/quickstart/hotpotqa/corpus.jsonl --retriever bm25 --out runs/quickstart/bm25
	$(BIN)/ragrl search runs/quickstart/bm25 "Which government position was held by Shirley Temple?" -k 3
	$(BIN)/ragrl search runs/quickstart/bm25 --queries runs/quickstart/hotpotqa/questions.jsonl \
		--out runs/quickstart/hits.jsonl --eval --eval-k 2,5,10

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

test: lint
	$(BIN)/python -m pytest -q

test-all: $(STAMP)
	$(BIN)/python -m pytest -q -m ""

bench: $(STAMP)
	$(BIN)/python benchmarks/retrieval_throughput.py
	$(BIN)/python benchmarks/retrieval_recall.py

clean:
	rm -rf runs .pytest_cache .hypothesis
