"""Answer and retrieval metrics."""
