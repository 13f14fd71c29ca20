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


PROBE = """
import sys
from ragrl.cli import main

for argv in sys.argv[1:]:
    try:
        main(argv.split("|"))
    except SystemExit as e:
        assert not e.code, (argv, e.code)
print(sorted({"torch", "transformers", "sentence_transformers", "ragrl.methods"} & set(sys.modules)))
"""


def test_the_command_line_starts_without_torch_and_lists_every_packaged_config(tmp_path):
    # `ragrl --help`, a BM25 index built and searched, answers scored and a question file's statistics,
    # in one fresh process: none of them waits for torch (about 2 s of imports here); a command imports
    # what it needs when it runs
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"id": "p1", "contents": "Kestrel Bay\\nKestrel Bay is a harbour town."}\n')
    index, hits = tmp_path / "index", tmp_path / "hits.jsonl"
    gold, preds = tmp_path / "gold.jsonl", tmp_path / "preds.jsonl"
    gold.write_text('{"id": "1", "question": "Where is the harbour?", "golden_answers": ["Kestrel Bay"]}\n')
    preds.write_text('{"id": "1", "prediction": "Kestrel Bay"}\n')
    runs = [
        "--help",
        f"index|{corpus}|--out|{index}",
        f"search|{index}|harbour town|--out|{hits}",
        f"score|{preds}|--gold|{gold}",
        f"data|stats|{gold}",
    ]
    done = subprocess.run([sys.executable, "-c", PROBE, *runs], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stdout.splitlines()[-1] == "[]" and "Kestrel Bay" in hits.read_text()
    # the help's list of configs, read from the methods' folder, is the one their import registers
    from ragrl.commands import PACKAGED_CONFIGS
    from ragrl.methods import available_methods

    assert PACKAGED_CONFIGS == available_methods() and "search_r1-tiny" in PACKAGED_CONFIGS


def test_bad_input_is_one_clear_line_not_a_traceback(tmp_path):
    bad = tmp_path / "preds.jsonl"
    bad.write_text('{"id": "1", "prediction": "x"}\n{oops\n')
    gold = tmp_path / "gold.jsonl"
    gold.write_text('{"id": "1", "question": "q?", "golden_answers": ["x"]}\n')
    result = _ragrl("score", str(bad), "--gold", str(gold))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert f"{bad}:2: invalid JSON" in " ".join(result.stderr.split())


def test_help_shows_no_type_on_flags_and_lists_choices():
    help_text = _ragrl("eval", "--help").stdout
    assert "<bool>" not in help_text and "--closed-book  " in help_text  # a flag takes no value
    assert "<oracle|quote|heuristic|single_step>" in help_text and "<transformers|vllm>" in help_text
    assert "search_r1-tiny" in help_text and "--set KEY=VALUE" in help_text
    train_help = _ragrl("train", "--help").stdout
    for key in ("search_r1-tiny", "train.model.path", "train.data.train", "train.data.index", "rollout.n"):
        assert key in train_help, key


def test_error_messages_keep_brackets_and_never_wrap(tmp_path):
    # rich markup would eat "[title, sentences]"; a piped (not terminal) error stays on one line
    long_dir = tmp_path / ("d" * 120)
    long_dir.mkdir()
    bad = long_dir / "h.json"
    bad.write_text('[{"_id": "a", "question": "q", "answer": "x", "context": 5}]')
    result = _ragrl("data", "convert", str(bad), "--format", "hotpotqa", "--out", str(tmp_path / "o"))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and f"{bad}:1:" in result.stderr
    assert "a list of [title, sentences] pairs" in result.stderr


def test_json_errors_never_read_at_at(tmp_path):
    bad = tmp_path / "q.jsonl"
    bad.write_text('{"id": "a\x01", "question": "q", "golden_answers": ["x"]}\n')
    result = _ragrl("data", "stats", str(bad))
    assert result.returncode == 2
    assert f"{bad}:1: invalid JSON (Invalid control character at column 10)" in result.stderr
    assert "at at" not in result.stderr


def test_readme_commands_write_only_under_runs():
    """The README's command blocks, pasted into a shell at the repository root, write nothing but the
    git-ignored runs/ folder (they once left an untracked world/ behind)."""
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", readme, flags=re.S)
    variables = dict(re.findall(r"^(\w+)=(\S+)", "\n".join(blocks), flags=re.M))
    outs = re.findall(r"--out\s+(\S+)", "\n".join(blocks))
    assert outs, "no --out in the README's commands"
    for out in outs:
        resolved = re.sub(r"\$(\w+)", lambda m: variables[m.group(1)], out)
        assert resolved.startswith("runs/"), out


LEAVE_UNDER_A_PROCESS_GROUP = """
import os, sys
import torch.distributed as dist
dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
real_exit = os._exit
def spy(code):
    print(f"leaving {code} initialized={dist.is_initialized()}", flush=True)
    real_exit(code)
os._exit = spy
from ragrl.cli import main
main(sys.argv[2:])
"""


def test_a_process_of_a_launched_run_leaves_its_group_and_keeps_the_exit_code(tmp_path):
    """Under torchrun / accelerate launch the command exits at once (gloo's threads abort some processes
    in the interpreter's teardown), with its output flushed and its exit status unchanged: 0 for success,
    after destroying the process group; 2 for bad input, without (a destroy could wait on a stuck peer)."""

    def run(*args: str) -> subprocess.CompletedProcess:
        store = tmp_path / f"store-{len(args)}"
        command = [sys.executable, "-c", LEAVE_UNDER_A_PROCESS_GROUP, str(store), *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=120)

    ok = run("--version")
    assert ok.returncode == 0
    assert ok.stdout.splitlines() == [f"ragrl {__version__}", "leaving 0 initialized=False"]
    missing = tmp_path / "missing.jsonl"
    bad = run("score", str(missing), "--gold", str(missing))
    assert bad.returncode == 2
    assert "leaving 2 initialized=True" in bad.stdout  # after a failure: out at once, no destroy to wait on
    assert "missing.jsonl" in " ".join(bad.stderr.split() + bad.stdout.split())


def test_a_path_that_cannot_be_written_is_one_line_naming_it(tmp_path, capsys):
    import pytest

    from ragrl.cli import main

    preds, gold = tmp_path / "preds.jsonl", tmp_path / "gold.jsonl"
    preds.write_text('{"id": "1", "prediction": "x"}\n')
    gold.write_text('{"id": "1", "question": "q?", "golden_answers": ["x"]}\n')
    folder, a_file = tmp_path / "folder", tmp_path / "file.txt"
    folder.mkdir()
    a_file.write_text("x")
    for out, message in (
        (folder, f"error: {folder}: a folder is there, where a file is to be written or read"),
        (a_file / "per.jsonl", f"error: {a_file}: a file is there, where a folder is to be made"),
    ):
        with pytest.raises(SystemExit) as e:
            main(["score", str(preds), "--gold", str(gold), "--per-example", str(out)])
        err = capsys.readouterr().err
        assert e.value.code == 2 and "Traceback" not in err
        assert " ".join(err.split()) == message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.txt", "folder", "gold.jsonl", "preds.jsonl"]
    assert list(folder.iterdir()) == []  # no temporary file left behind


def test_no_command_help_shows_docstring_markup():
    from typer.main import get_command
    from typer.testing import CliRunner

    from ragrl.cli import app

    def commands(group, path=()):
        for name, command in getattr(group, "commands", {}).items():
            yield (*path, name)
            yield from commands(command, (*path, name))

    runner, names = CliRunner(), list(commands(get_command(app)))
    assert ("reward-model",) in names and ("data", "convert") in names
    for name in names:
        result = runner.invoke(app, [*name, "--help"])
        assert result.exit_code == 0 and "``" not in result.output, (name, result.output)


def test_only_a_path_the_user_gave_is_one_line_other_file_errors_keep_their_traceback(monkeypatch, capsys):
    import errno

    import pytest

    import ragrl.cli as cli

    def raising(error):
        def app(args=None):
            raise error

        return app

    for error, line in (
        (PermissionError(errno.EACCES, "Permission denied", "/out/x.jsonl"),
         "/out/x.jsonl: Permission denied"),
        (IsADirectoryError(errno.EISDIR, "Is a directory", "/out/.x.tmp", None, "/out/x"),
         "/out/x: a folder is there, where a file is to be written or read"),  # the rename's target
    ):  # fmt: skip
        monkeypatch.setattr(cli, "app", raising(error))
        with pytest.raises(SystemExit) as e:
            cli.main([])
        assert e.value.code == 2 and " ".join(capsys.readouterr().err.split()) == f"error: {line}"
    # a missing file ragrl did not check for, a file-system error without a path: a failure in full
    for error in (FileNotFoundError(errno.ENOENT, "No such file", "/in"), OSError(errno.ENOSPC, "full")):
        monkeypatch.setattr(cli, "app", raising(error))
        with pytest.raises(type(error)):
            cli.main([])
