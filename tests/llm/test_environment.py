"""The environment a run records: the machine, the libraries and the commit its numbers came from."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from importlib import metadata
from pathlib import Path

import torch

from ragrl.llm import environment as env_module
from ragrl.llm.environment import changes, environment, installed_packages, record_environment


def test_the_environment_names_the_cpu_kernels_libraries_and_every_package():
    env = environment()
    assert env["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert env["torch_threads"] == torch.get_num_threads() and env["cpus"] >= 1
    assert env["versions"]["torch"] == metadata.version("torch")
    assert env["versions"]["transformers"] == metadata.version("transformers")
    packages = env["packages"]
    assert packages == list(installed_packages())
    assert packages == sorted(packages, key=lambda p: p.split("==")[0].lower())
    assert f"torch=={metadata.version('torch')}" in packages
    assert env["packages_sha256"] == hashlib.sha256("\n".join(packages).encode()).hexdigest()
    assert (env["gpu"] is None) == (not torch.cuda.is_available())
    package = Path(env_module.__file__).parents[1]
    tracked = subprocess.run(["git", "ls-files", "--error-unmatch", "--", "llm/environment.py"], cwd=package,
                             capture_output=True).returncode == 0  # fmt: skip
    if tracked:  # a checkout git can read (not an installed wheel, not a repository git refuses here)
        assert re.fullmatch(r"[0-9a-f]{40}(-dirty)?", env["git_commit"])


def test_a_fresh_run_records_one_start_and_a_resume_adds_its_own(tmp_path, monkeypatch, capsys):
    path = tmp_path / "run" / "environment.json"
    first = record_environment(path)
    assert json.loads(path.read_text()) == [first] and first["step"] == 0
    second = record_environment(path, step=4)
    assert [s["step"] for s in json.loads(path.read_text())] == [0, 4] and second["step"] == 4
    assert "another environment" not in capsys.readouterr().err

    other = {**environment(), "cpu_capability": "DEFAULT", "packages_sha256": "0" * 64}
    monkeypatch.setattr(env_module, "environment", lambda device=None: other)
    record_environment(path, step=9)
    err = capsys.readouterr().err
    assert "resumed at step 9 in another environment than step 4's" in err
    assert f"cpu_capability: {second['cpu_capability']} -> DEFAULT" in err and "packages_sha256" in err
    assert [s["step"] for s in json.loads(path.read_text())] == [0, 4, 9]

    record_environment(path)  # started afresh: the old starts are gone
    assert [s["step"] for s in json.loads(path.read_text())] == [0]


def test_an_unreadable_record_is_replaced_and_said(tmp_path, capsys):
    path = tmp_path / "environment.json"
    path.write_text("{not json", encoding="utf-8")
    record_environment(path, step=3)
    assert f"warning: {path}: unreadable" in capsys.readouterr().err
    assert [s["step"] for s in json.loads(path.read_text())] == [3]
    path.write_text('{"step": 0}', encoding="utf-8")
    record_environment(path, step=5)
    assert "not a list of starts" in capsys.readouterr().err


def test_a_distribution_without_metadata_is_passed_over(monkeypatch):
    class Dist:
        def __init__(self, name, version):
            self.metadata, self.version = ({"Name": name} if name else None), version

    found = [Dist("zeta", "1"), Dist(None, "?"), Dist("Alpha", "2"), Dist("alpha", "3")]
    monkeypatch.setattr(env_module.metadata, "distributions", lambda: found)
    installed_packages.cache_clear()  # taken once a process: taken again here, and after the test
    try:
        assert installed_packages() == ("Alpha==2", "zeta==1")  # the first of one name, as Python finds it
    finally:
        installed_packages.cache_clear()


def test_the_commit_is_none_where_the_package_is_not_tracked(monkeypatch):
    def untracked(args, **kwargs):
        return subprocess.CompletedProcess(args, 1 if "ls-files" in args else 0, "abc\n", "")

    monkeypatch.setattr(env_module.subprocess, "run", untracked)
    env_module.git_commit.cache_clear()
    try:
        assert env_module.git_commit() is None  # a wheel inside some other repository is not its code
    finally:
        env_module.git_commit.cache_clear()


def test_changes_lists_the_compared_fields_and_library_versions():
    before = {"cpu": "a", "git_commit": "x", "versions": {"torch": "2.12.0", "numpy": "2.0"}}
    after = {"cpu": "a", "git_commit": "y", "versions": {"torch": "2.13.0", "numpy": "2.0"}}
    assert changes(before, after) == ["git_commit: x -> y", "torch: 2.12.0 -> 2.13.0"]
    assert changes(after, after) == []
