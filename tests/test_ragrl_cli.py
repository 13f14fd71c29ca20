import subprocess
import sys

from ragrl import __version__


def _ragrl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ragrl", *args], capture_output=True, text=True, timeout=120)


def test_version_and_help():
    assert _ragrl("--version").stdout.strip() == f"ragrl {__version__}"
    out = _ragrl("--help").stdout
    for command in ("data", "score", "index", "search"):
        assert command in out


def test_bad_input_is_one_clear_line_not_a_traceback(tmp_path):
    bad = tmp_path / "preds.jsonl"
    bad.write_text('{"id": "1", "prediction": "x"}\n{oops\n')
    gold = tmp_path / "gold.jsonl"
    gold.write_text('{"id": "1", "question": "q?", "golden_answers": ["x"]}\n')
    result = _ragrl("score", str(bad), "--gold", str(gold))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert f"{bad}:2: invalid JSON" in " ".join(result.stderr.split())
