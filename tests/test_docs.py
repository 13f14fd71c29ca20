"""The docs against the code: every name a Python snippet imports exists; the snippets that are whole
programs run as written and do what their comments say (sketches with ``...`` placeholders are checked
for their imports only); every ``ragrl`` option and every config key the docs and the Makefile name
exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
DOCS = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]


def python_blocks() -> list[tuple[str, str]]:
    """``(file:line, code)`` of every fenced python block of the docs and the README."""
    blocks = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for m in re.finditer(r"```python\n(.*?)```", text, re.S):
            blocks.append((f"{path.relative_to(ROOT)}:{text[: m.start()].count(chr(10)) + 1}", m.group(1)))
    return blocks


def block(where: str) -> str:
    """The block that starts at ``where`` (``docs/x.md:LINE``, the line may move: the file and the first
    import line identify it)."""
    found = [code for place, code in python_blocks() if place.split(":")[0] == where.split(":")[0]]
    wanted = where.split(":", 1)[1]
    matching = [code for code in found if wanted in code]
    assert len(matching) == 1, f"{where}: {len(matching)} blocks hold {wanted!r}"
    return matching[0]


IMPORT = re.compile(r"^(from \S+ import [^#\n]+|import [^#\n]+)", re.M)


@pytest.mark.parametrize(("where", "code"), python_blocks(), ids=[w for w, _ in python_blocks()])
def test_every_name_a_snippet_imports_exists(where, code):
    for statement in IMPORT.findall(code):
        try:
            exec(statement, {})
        except ImportError as e:
            pytest.fail(f"{where}: `{statement.strip()}` fails: {e}")


def test_the_docs_hold_python_snippets():
    assert len(python_blocks()) >= 10  # the parametrized test above is not empty by accident


def test_the_advantage_example_registers_and_ranks_within_each_group(monkeypatch):
    from ragrl.algos import ADVANTAGES, get_advantage

    monkeypatch.setattr(ADVANTAGES, "_fns", dict(ADVANTAGES._fns))  # the example's name goes afterwards
    namespace: dict = {}
    exec(block("docs/algos.md:register_advantage"), namespace)
    fn = get_advantage("my_method_rank")
    rewards = torch.tensor([0.0, 1.0, 2.0, 5.0, 3.0])
    advantages = fn(rewards, [0, 0, 0, 1, 1])
    # group 0: ranks 0, 1, 2 centred on 1; group 1: 1 and 0 centred on 0.5
    assert advantages.tolist() == [-1.0, 0.0, 1.0, 0.5, -0.5]


def test_the_synthetic_world_snippet_writes_a_world(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exec(block("docs/synth.md:generate_world(seed=0"), {})
    assert {"train.jsonl", "dev.jsonl", "test.jsonl", "corpus.jsonl"} <= {
        p.name for p in (tmp_path / "data" / "synth0").iterdir()
    }


def test_the_readme_snippet_reads_the_quickstart_s_hotpotqa_files(shared_data, tmp_path, monkeypatch, capsys):
    """The README's library example, on the files `make quickstart` writes (made here the same way)."""
    from typer.testing import CliRunner

    from ragrl.cli import app

    runner = CliRunner()
    out = tmp_path / "runs" / "quickstart" / "hotpotqa"
    source = shared_data / "hotpotqa" / "leeyeezeee__benchfortir" / "test.jsonl"
    assert runner.invoke(app, ["data", "convert", str(source), "--out", str(out)]).exit_code == 0
    assert runner.invoke(app, ["index", str(out / "corpus.jsonl"), "--out", str(out / "bm25")]).exit_code == 0
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(block("README.md:read_examples"), namespace)
    hits, examples = namespace["hits"], namespace["examples"]
    assert len(hits) == 4 and all(len(h) == 5 for h in hits)
    title, em = capsys.readouterr().out.strip().rsplit(" ", 1)
    assert title == hits[0][0].passage.title and float(em) == float(
        examples[0].answers == ["Chief of Protocol"]
    )


# -- the commands and config keys the docs name ------------------------------------------------------

TEXTS = [*DOCS, ROOT / "Makefile"]
COMMAND = re.compile(r"(?:^|[`$\s(/])ragrl ((?:[a-z][a-z0-9_-]* ?){1,2})([^`\n|;&]*)")  # /: $(BIN)/ragrl
KEY = re.compile(r"(?<![\w./-])((?:train|rollout|reward|protocol|method|data)\.[a-z_][a-z0-9_.]*[a-z0-9_])=")
NOT_RAGRL_KEYS = ("reward.custom_reward_function.",)  # verl's own config, in docs/scale.md
METHODS = ("search_r1", "arena", "eval_rar", "tiresrag", "r2ag", "evo_rag")


def test_every_ragrl_option_the_docs_use_exists():
    import typer

    from ragrl.cli import app

    root = typer.main.get_command(app)
    unknown, checked = [], 0
    for path in TEXTS:
        # a command continued with a backslash is one line (named by its first)
        text = re.sub(r"\\\n\s*", " ", path.read_text(encoding="utf-8"))
        for n, line in enumerate(text.splitlines(), 1):
            for m in COMMAND.finditer(line):
                command, used = root, []
                for word in m.group(1).split():
                    if word not in getattr(command, "commands", {}):
                        break
                    command, used = command.commands[word], [*used, word]
                if not used or hasattr(command, "commands"):
                    continue
                known = {o for p in command.params for o in (*p.opts, *getattr(p, "secondary_opts", ()))}
                rest = m.group(1)[len(" ".join(used)) :] + m.group(2)
                for option in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", rest):
                    checked += 1
                    if option not in known | {"--help"}:
                        unknown.append(f"{path.relative_to(ROOT)}:{n}: ragrl {' '.join(used)} {option}")
    makefile = re.sub(r"\\\n\s*", " ", (ROOT / "Makefile").read_text(encoding="utf-8"))
    assert len(COMMAND.findall(makefile)) >= 10  # the Makefile's $(BIN)/ragrl calls are read too
    assert checked > 200 and not unknown, unknown


def test_every_config_key_the_docs_set_exists():
    from omegaconf import OmegaConf

    from ragrl.methods import load_method

    configs = [OmegaConf.create(load_method(name).resolved_yaml()) for name in METHODS]

    def exists(key: str) -> bool:
        for config in configs:
            try:
                if OmegaConf.select(config, key, default=KeyError) is not KeyError:
                    return True
            except Exception:  # a key path through a list or a value: not this config's
                pass
        return False

    unknown, checked = [], 0
    for path in TEXTS:
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for key in KEY.findall(line):
                checked += 1
                if not key.startswith(NOT_RAGRL_KEYS) and not exists(key):
                    unknown.append(f"{path.relative_to(ROOT)}:{n}: {key}")
    assert checked > 100 and not unknown, unknown
