"""Canonical data: the ``Example``/``Passage`` schema, file I/O, dataset loaders and statistics."""

from ragrl.data.io import LoadReport, read_corpora, read_corpus, read_examples, write_corpus, write_examples
from ragrl.data.loaders import FORMATS, load_dataset
from ragrl.data.schema import Example, Passage, SubQuestion, passage_id

__all__ = [
    "FORMATS",
    "load_dataset",
    "Example",
    "LoadReport",
    "Passage",
    "SubQuestion",
    "passage_id",
    "read_corpora",
    "read_corpus",
    "read_examples",
    "write_corpus",
    "write_examples",
]
