"""Adapters that put ragrl's methods on other engines (``verl``: docs/scale.md)."""
