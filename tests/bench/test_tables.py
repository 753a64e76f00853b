"""bench/tables.py: console and markdown tables, and the progress line."""

from bench.tables import Column, Table, markdown_grid

TABLE = Table([Column("a", "A", ""), Column("b", "B", ".2f")])
ROWS = [{"a": "x", "b": 1.234}, {"a": "y", "b": None}]


def _cells(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


def test_console_table_formats_cells_and_missing_values():
    lines = TABLE.render(ROWS).splitlines()
    assert lines[0].split() == ["A", "B"] and lines[2].split() == ["x", "1.23"] and lines[-1].split() == ["y", "-"]


def test_markdown_table():
    md = TABLE.markdown(ROWS).splitlines()
    assert _cells(md[0]) == ["A", "B"] and set(md[1]) <= set("|-: ") and _cells(md[2]) == ["x", "1.23"]
    assert _cells(md[3]) == ["y", "-"]


def test_progress_line_and_grid():
    assert TABLE.line(ROWS[0]) == "A x  B 1.23"
    md = markdown_grid(["", "flash"], [["GFLOPs", "1.0 / 2.0"]]).splitlines()
    assert _cells(md[0]) == ["", "flash"] and _cells(md[2]) == ["GFLOPs", "1.0 / 2.0"]  # kept as text, not parsed
