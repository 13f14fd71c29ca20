"""`ragrl score`. (Placeholder until the metrics work lands.)"""


def score() -> None:
    """Score predictions against a canonical question file."""
    raise NotImplementedError
