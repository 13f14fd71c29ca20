"""The words a policy trained on the packaged methods must be able to write and read (for a tokenizer
trained from scratch)."""

from __future__ import annotations

from functools import cache
from typing import Any

from omegaconf import OmegaConf

from ragrl.config import available_methods, files, load_method, load_method_config


def vocabulary_texts() -> list[str]:
    """The words a policy trained here must be able to write and read, for a tokenizer trained from
    scratch (``ragrl.llm.tiny.create_tiny_policy(..., extra_texts=vocabulary_texts())``): every string
    in the ``protocol`` sections of the packaged method configs (prompt templates, observation and
    corrective texts), each method protocol's built-in wording (``Protocol.fixed_texts``), and the
    phrases the synthetic world's demonstrators write (what a warm start on demonstrations teaches).
    The rest of a config (reward names, paths, labels) is not text the policy reads or writes: leaving
    it out keeps the tokenizer, and so every tiny run, unchanged when such a setting changes.

    The configs are read once a process for each set of config folders and names (building every
    method takes about a second; a folder registered later, or a config added to one, is read anew);
    each call returns a new list."""
    folders = tuple(str(folder) for folder in files.CONFIG_FOLDERS)  # read now: a test may replace it
    return list(_vocabulary_texts(folders, tuple(available_methods())))


@cache
def _vocabulary_texts(folders: tuple[str, ...], names: tuple[str, ...]) -> tuple[str, ...]:
    """``vocabulary_texts`` of the configs ``names`` (in ``folders``: the cache's key)."""
    from ragrl.synth.demonstrators import demonstrator_texts

    texts: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, str):
            texts.append(node)
        elif isinstance(node, dict):
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    for name in names:
        walk(OmegaConf.to_container(load_method_config(name)).get("protocol", {}))
        texts.extend(load_method(name).protocol.fixed_texts())
    return (*texts, *demonstrator_texts())
