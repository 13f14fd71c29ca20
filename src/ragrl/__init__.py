"""ragrl: train and evaluate retrieval-augmented reasoning agents with reinforcement learning."""

from ragrl.data.schema import Example, Passage, SubQuestion
from ragrl.errors import DataError, RagrlError

__version__ = "0.1.0"
__all__ = ["DataError", "Example", "Passage", "RagrlError", "SubQuestion", "__version__"]
