"""``vocabulary_texts``: the words of every loadable config's protocol, read once a process for each set of
config folders and names."""

from __future__ import annotations

from ragrl.config import files
from ragrl.methods import vocabulary_texts


def test_the_vocabulary_is_read_once_and_anew_when_a_config_folder_is_registered(tmp_path, monkeypatch):
    first, again = vocabulary_texts(), vocabulary_texts()
    assert first == again and first is not again  # each call a new list: a caller may extend its own
    assert "Zorblax" not in " ".join(first)
    monkeypatch.setattr(files, "CONFIG_FOLDERS", list(files.CONFIG_FOLDERS))  # restored after the test
    user = "Ask Zorblax first. Question: {question}"
    (tmp_path / "mine.yaml").write_text(f"method: search_r1\nprotocol:\n  user: '{user}'\n", encoding="utf-8")
    files.register_config_folder(tmp_path)
    assert user in vocabulary_texts()  # the new folder's config is read, not the cached list
