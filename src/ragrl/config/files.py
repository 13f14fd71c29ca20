"""Config files: a method's YAML (a packaged name or a path), ``--set`` overrides, and the check of a
config against its dataclass schema.

A method's config is a packaged YAML file (``ragrl/methods/configs/<name>.yaml``, registered by
``ragrl.methods``: ``register_config_folder``) loaded with OmegaConf;
``load_method_config`` reads it (or any YAML path) and applies ``a.b=value`` overrides, and
``to_dataclass`` checks it against the method's schema (unknown keys and wrong types are ``RagrlError``s
that name the key).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ragrl.data.io import read_text
from ragrl.errors import RagrlError

T = TypeVar("T")


CONFIG_FOLDERS: list[Any] = []
"""The folders whose ``<name>.yaml`` files are configs loadable by name, in the order they were
registered: ``ragrl.methods`` registers ``ragrl/methods/configs`` when it is imported; a package of
methods of one's own can register its folder the same way."""


def register_config_folder(folder: Any) -> None:
    """Make the ``<name>.yaml`` files of ``folder`` (a path or an ``importlib.resources`` folder)
    loadable by name. A name in two folders is taken from the first registered."""
    if all(str(folder) != str(known) for known in CONFIG_FOLDERS):
        CONFIG_FOLDERS.append(folder)


def _packaged(name: str) -> Any:
    for folder in CONFIG_FOLDERS:
        candidate = folder / f"{name}.yaml"
        if candidate.is_file():
            return candidate
    return None


def available_methods() -> list[str]:
    """The names of the configs loadable by name (the registered folders' ``*.yaml``)."""
    names = {p.name[: -len(".yaml")] for f in CONFIG_FOLDERS for p in f.iterdir() if p.name.endswith(".yaml")}
    return sorted(names)


def _read_yaml(name_or_path: str | Path) -> DictConfig:
    text: str
    where: str
    p = Path(name_or_path)
    # a folder named as a method (`ragrl train search_r1 --out search_r1`) does not hide the method
    named = p.is_dir() and "/" not in str(name_or_path) and _packaged(str(name_or_path)) is not None
    if not named and (p.suffix in (".yaml", ".yml") or p.exists() or "/" in str(name_or_path)):
        if p.is_dir():
            inside = p / "config.yaml"
            hint = f"; its resolved config is {inside}" if inside.is_file() else ""
            raise RagrlError(f"{p}: a folder, not a config file{hint}")
        if not p.is_file():
            raise RagrlError(f"{p}: no such config file")
        text, where = read_text(p), str(p)
    else:
        name = str(name_or_path)
        res = _packaged(name)
        if res is None:
            known = (
                ", ".join(available_methods())
                or "none: import ragrl.methods to register the packaged configs"
            )
            raise RagrlError(f"unknown method {name!r} (packaged: {known})")
        text, where = res.read_text(encoding="utf-8"), f"{name}.yaml"
    try:
        cfg = OmegaConf.create(text)
    except Exception as e:  # yaml errors come in several types
        raise RagrlError(_yaml_error(where, e)) from None
    if not isinstance(cfg, DictConfig):
        raise RagrlError(f"{where}: expected a mapping at the top level")
    return cfg


def _first_line(e: Exception) -> str:
    """An OmegaConf error's message without the lines it adds (``full_key``, ``object_type``)."""
    return next(iter(str(e).splitlines()), type(e).__name__)


def apply_overrides(cfg: DictConfig, overrides: Sequence[str] | Mapping[str, Any] | None) -> DictConfig:
    """Apply ``["a.b=1", "reward.1.weight=0.2"]`` (``--set`` style; list items by index) or a mapping
    of dotted keys to values. Values are parsed as OmegaConf parses YAML scalars and lists."""
    if not overrides:
        return cfg
    if isinstance(overrides, Mapping):
        items = list(overrides.items())
    else:
        bad = [o for o in overrides if "=" not in o or not o.split("=", 1)[0].strip()]
        if bad:
            raise RagrlError(f"overrides must look like key.path=value, got {', '.join(map(repr, bad))}")
        items = []
        for o in overrides:
            key, raw = o.split("=", 1)
            try:
                items.append((key.strip(), OmegaConf.to_container(OmegaConf.from_dotlist([f"v={raw}"]))["v"]))
            except OmegaConfBaseException as e:
                raise RagrlError(f"bad override {o!r}: {_first_line(e)}") from None
    cfg = cfg.copy()
    for key, value in items:
        try:
            OmegaConf.update(cfg, key, value, merge=True, force_add=True)
        except (OmegaConfBaseException, TypeError, ValueError, IndexError) as e:
            raise RagrlError(f"bad override {key}={value!r}: {_first_line(e)}") from None
    return cfg


def load_method_config(
    name_or_path: str | Path, overrides: Sequence[str] | Mapping[str, Any] | None = None
) -> DictConfig:
    """A method's config: a packaged name (``"search_r1"``) or a YAML path, with overrides applied."""
    return apply_overrides(_read_yaml(name_or_path), overrides)


def _yaml_error(where: str, e: Exception) -> str:
    """A YAML error on one line: ``FILE:LINE: invalid YAML (<problem> at column N)``."""
    mark = getattr(e, "problem_mark", None)
    problem = " ".join(str(getattr(e, "problem", None) or str(e) or type(e).__name__).split())
    if mark is not None:
        return f"{where}:{mark.line + 1}: invalid YAML ({problem} at column {mark.column + 1})"
    return f"{where}: invalid YAML ({problem})"


def to_dataclass(schema: type[T], cfg: DictConfig | Mapping[str, Any]) -> T:
    """Validate ``cfg`` against a dataclass ``schema`` and build it (nested dataclasses included)."""
    try:
        merged = OmegaConf.merge(OmegaConf.structured(schema), cfg)
        obj = OmegaConf.to_object(merged)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None)
        reason = (str(e.msg if hasattr(e, "msg") else e).strip().splitlines() or [type(e).__name__])[0]
        raise RagrlError(f"config{' key ' + repr(key) if key else ''}: {reason}") from None
    except (TypeError, ValueError) as e:
        raise RagrlError(f"config: {e}") from None
    return obj  # type: ignore[return-value]
