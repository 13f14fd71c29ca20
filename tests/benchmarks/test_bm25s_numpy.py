"""``benchmarks/bm25s_numpy.py`` end to end on a small corpus of the shared data's layout, this interpreter
on both sides (the comparison itself needs a second virtualenv): the hits are checked, the versions and
the ratio printed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "bm25s_numpy.py"


def _small_data(root: Path) -> dict[str, str]:
    corpus = root / "corpus/OSU-NLP-Group__HippoRAG/2wikimultihopqa_corpus.json"
    questions = root / "2wikimultihopqa/peterbaile__lag/dev.json"
    corpus.parent.mkdir(parents=True)
    questions.parent.mkdir(parents=True)
    towns = ["Kestrel Bay", "Olvana", "Thaesukren", "Marrow Hill", "Ashford Vale", "Coldwater"]
    passages = [{"title": f"{t} {i}", "text": f"{t} is a harbour town founded in {1800 + i}."}
                for i in range(5) for t in towns]  # fmt: skip
    corpus.write_text(json.dumps(passages))
    questions.write_text(json.dumps([{"question": f"When was {t} founded?"} for t in towns]))
    return {**os.environ, "RAGRL_SHARED_DATA": str(root)}


def test_the_numpy_comparison_checks_the_hits_and_prints_the_versions_and_the_ratio(tmp_path):
    env = _small_data(tmp_path)
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--other", sys.executable, "--rounds", "1", "--repeats", "1"],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert len(lines) == 4 and lines[0].startswith("round 1: numpy ") and "bm25s " in lines[0]
    assert lines[2].startswith("the same scores for all 6 queries (within 0.0e+00); 0 differ")
    assert lines[3].startswith("numpy ") and float(lines[3].split(": ")[1]) > 0


def test_the_numpy_comparison_refuses_a_missing_interpreter_and_a_corpus_that_matches_nothing(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--other PYTHON is required" in done.stderr
    env = _small_data(tmp_path)
    dev = tmp_path / "2wikimultihopqa/peterbaile__lag/dev.json"
    dev.write_text(json.dumps([{"question": "Who painted Zyxwv?"}] * 4))  # no word of the corpus
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--other", sys.executable, "--rounds", "1", "--repeats", "1"],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=300,
    )  # fmt: skip
    assert done.returncode == 1 and "most queries found nothing" in done.stderr
