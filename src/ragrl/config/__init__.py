"""Configuration: a method's YAML config read and checked, the ``train:`` schema, and the method registry.

- ``ragrl.config.files``: the YAML of a packaged name or a path, ``--set`` overrides, ``to_dataclass``
  (a config checked against its schema; errors name the key);
- ``ragrl.config.train``: ``TrainConfig``, the ``train:`` section every method shares
  (``ragrl.config.train_checks`` checks it);
- ``ragrl.config.method``: ``Method`` (a loaded method), ``register_method`` and ``load_method``.

The papers' methods live in ``ragrl.methods`` (one package per paper) and register themselves there.
"""

from __future__ import annotations

from ragrl.config.files import apply_overrides, available_methods, load_method_config, to_dataclass
from ragrl.config.method import METHODS, Method, build_method, load_method, register_method
from ragrl.config.train import TrainConfig

__all__ = [
    "METHODS",
    "Method",
    "TrainConfig",
    "apply_overrides",
    "available_methods",
    "build_method",
    "load_method",
    "load_method_config",
    "register_method",
    "to_dataclass",
]
