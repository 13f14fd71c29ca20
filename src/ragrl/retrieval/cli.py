"""`ragrl index` and `ragrl search`. (Placeholder until the retrieval work lands.)"""


def index() -> None:
    """Build a retrieval index."""
    raise NotImplementedError


def search() -> None:
    """Search an index."""
    raise NotImplementedError
