"""Errors that name what is wrong and where.

Every error a user can cause with bad input is a ``RagrlError``; the CLI prints its message and exits
with status 2 instead of a traceback. ``DataError`` carries the file, line and field so the message
always says where to look.
"""

from __future__ import annotations

from pathlib import Path


class RagrlError(Exception):
    """Base class for user-facing errors (bad input, missing files, unknown names)."""


class DataError(RagrlError):
    """A malformed record in a data file.

    ``str(err)`` reads like ``data/train.jsonl:17: field 'question': missing``. ``record`` names the
    record where a line number alone does not (``dev.json:57: JSON array item [3]: field ...``).
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | Path | None = None,
        line: int | None = None,
        field: str | None = None,
        record: str | None = None,
    ) -> None:
        self.message = message
        self.record = record
        self.path = str(path) if path is not None else None
        self.line = line
        self.field = field
        super().__init__(self._render())

    def _render(self) -> str:
        where = self.path or "<input>"
        if self.line is not None:
            where += f":{self.line}"
        if self.record:
            where += f": {self.record}"
        what = f"field '{self.field}': " if self.field else ""
        return f"{where}: {what}{self.message}"

    def at(self, *, path: str | Path | None = None, line: int | None = None) -> DataError:
        """The same error with the location filled in where it was still unknown."""
        return DataError(
            self.message,
            path=self.path or path,
            line=self.line if self.line is not None else line,
            field=self.field,
            record=self.record,
        )
