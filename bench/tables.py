"""Console and markdown tables of result rows (tabulate), and the one-line progress of a sweep."""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Sequence

from tabulate import tabulate


def fmt(value: Any, spec: str = ".3g") -> str:
    """A table cell: None -> '-', floats with `spec`, everything else str()."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return format(value, spec)
    return str(value)


@dataclasses.dataclass(frozen=True)
class Column:
    key: str  # the row's key
    title: str  # the header
    spec: str = ".3g"  # float format


class Table:
    """Rows of dicts shown as the columns chosen, for the console (`render`), for markdown files
    (`markdown`) and as one progress line per row while a sweep runs (`line`)."""

    def __init__(self, columns: Sequence[Column]) -> None:
        self.columns = list(columns)

    def _cells(self, rows: Iterable[dict[str, Any]]) -> list[list[str]]:
        return [[fmt(row.get(c.key), c.spec) for c in self.columns] for row in rows]

    def render(self, rows: Iterable[dict[str, Any]]) -> str:
        # cells are formatted here (None -> '-', per-column precision), so tabulate must not re-parse numbers
        return tabulate(self._cells(rows), headers=[c.title for c in self.columns], disable_numparse=True, stralign="right")

    def markdown(self, rows: Iterable[dict[str, Any]]) -> str:
        return tabulate(self._cells(rows), headers=[c.title for c in self.columns], tablefmt="github", disable_numparse=True)

    def line(self, row: dict[str, Any]) -> str:
        return "  ".join(f"{c.title} {cell}" for c, cell in zip(self.columns, self._cells([row])[0]))


def markdown_grid(header: Sequence[str], body: Sequence[Sequence[Any]]) -> str:
    """A markdown table of cells already formatted (e.g. a transposed table with a label column)."""
    return tabulate([list(map(str, r)) for r in body], headers=list(header), tablefmt="github", disable_numparse=True)
