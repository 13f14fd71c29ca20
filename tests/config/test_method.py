"""The method registry and a config read once (ragrl.config.method)."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from ragrl.config import (
    METHODS,
    Method,
    available_methods,
    build_method,
    files,
    load_method_config,
    register_method,
)
from ragrl.errors import RagrlError
from ragrl.methods import load_method
from ragrl.methods.search_r1 import build_method as build_search_r1


def test_every_packaged_config_names_a_registered_method() -> None:
    assert {"arena", "eval_rar", "evo_rag", "r2ag", "search_r1", "tiresrag"} <= set(METHODS.names())
    assert len(available_methods()) == 14
    for name in available_methods():
        method = load_method(name)
        assert method.source["method"] in METHODS and method.where == name


def test_a_package_registers_its_own_config_folder(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(files, "CONFIG_FOLDERS", list(files.CONFIG_FOLDERS))  # restored after the test
    (tmp_path / "mine.yaml").write_text("method: search_r1\nrollout: {n: 5}\n", encoding="utf-8")
    with pytest.raises(RagrlError, match=r"unknown method 'mine' \(packaged: arena, "):
        load_method("mine")
    files.register_config_folder(tmp_path)
    files.register_config_folder(tmp_path)  # once is enough
    assert files.CONFIG_FOLDERS.count(tmp_path) == 1 and "mine" in available_methods()
    assert load_method("mine").rollout.n == 5


def test_a_new_method_registers_and_loads_from_a_path(tmp_path) -> None:
    calls = []

    def build(cfg) -> Method:
        calls.append(cfg.get("note"))
        plain = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "note"])
        return build_search_r1(OmegaConf.merge(plain, {"method": "search_r1"}))

    name = "test_registry_method"
    if name not in METHODS:
        register_method(name)(build)
    path = tmp_path / "mine.yaml"
    path.write_text(f"method: {name}\nnote: first\n", encoding="utf-8")
    method = load_method(path, ["rollout.n=3"])
    assert calls[-1] == "first" and method.rollout.n == 3 and method.where == str(path)
    with pytest.raises(RagrlError, match=rf"{path}: unknown method 'nope' \(registered: arena, "):
        path.write_text("method: nope\n", encoding="utf-8")
        load_method(path)


def test_with_overrides_derives_from_the_loaded_config_without_reading_the_file(tmp_path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text(OmegaConf.to_yaml(load_method_config("search_r1")), encoding="utf-8")
    method = load_method(path, ["rollout.n=4"])
    path.write_text("method: broken\n", encoding="utf-8")  # a later read would fail
    stage = method.with_overrides(["train.steps=7", "train.out=elsewhere"])
    assert (stage.rollout.n, stage.train.steps, stage.train.out) == (4, 7, "elsewhere")
    assert method.train.steps != 7  # the original is untouched
    resolved = OmegaConf.create(stage.resolved_yaml())
    assert (resolved.rollout.n, resolved.train.steps) == (4, 7)


def test_a_bad_stage_fails_when_the_config_loads_naming_the_stage() -> None:
    cfg = load_method_config("search_r1", ["train.stages=[{name: a, overrides: [train.grpo.kl=k9]}]"])
    with pytest.raises(RagrlError, match=r"^x\.yaml: train\.stages\[0\] \(a\): .*k9"):
        build_method(cfg, "x.yaml")


def test_a_bad_override_is_one_line_naming_it() -> None:
    for override, message in (
        ("reward.9.weight=0.2", "search_r1-tiny: bad override reward.9.weight=0.2: list index out of range"),
        ("reward.0.weight=abc", "reward[0] (em): weight must be a number, got 'abc'"),
    ):
        with pytest.raises(RagrlError) as e:
            load_method("search_r1-tiny", [override])
        assert message in str(e.value) and "\n" not in str(e.value), str(e.value)
