"""A keyed QAbstractTableModel: rows are added, changed and removed by key from node events.

Every table of the app (models, requests, peers, segments, overview) is one of these with its own
columns. Rows are plain values (dicts or trace objects); a `Column` says how to show one field.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Any

from PySide6.QtCore import QAbstractTableModel, QModelIndex, QPersistentModelIndex, Qt
from PySide6.QtGui import QColor

ROW_KEY_ROLE = Qt.ItemDataRole.UserRole + 1  # the row's key
ROW_VALUE_ROLE = Qt.ItemDataRole.UserRole + 2  # the row's value object

_ALIGN_RIGHT = Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter
_ALIGN_LEFT = Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter

AnyIndex = QModelIndex | QPersistentModelIndex


@dataclass(frozen=True)
class Column:
    """How one column shows a row: title, text, and optional tooltip, colour, alignment."""

    title: str
    text: Callable[[Any], str]
    tooltip: Callable[[Any], str | None] | None = None
    color: Callable[[Any], str | None] | None = None  # a colour name for the text, or None
    numeric: bool = False  # right-aligned
    header_tip: str | None = None


class KeyedTableModel(QAbstractTableModel):
    """Rows kept in display order, addressed by key; signals exactly what changed."""

    def __init__(self, columns: list[Column], *, newest_first: bool = False, max_rows: int = 0,
                 parent=None):
        super().__init__(parent)
        self.columns = columns
        self.newest_first = newest_first
        self.max_rows = max_rows  # 0 = unbounded; else the oldest rows are dropped
        self._keys: list[Hashable] = []
        self._values: dict[Hashable, Any] = {}

    # --- Qt model interface ---

    def rowCount(self, parent: AnyIndex = QModelIndex()) -> int:
        return 0 if parent.isValid() else len(self._keys)

    def columnCount(self, parent: AnyIndex = QModelIndex()) -> int:
        return 0 if parent.isValid() else len(self.columns)

    def data(self, index: AnyIndex, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid() or index.row() >= len(self._keys) or index.column() >= len(self.columns):
            return None
        key = self._keys[index.row()]
        value = self._values[key]
        column = self.columns[index.column()]
        if role == Qt.ItemDataRole.DisplayRole:
            return column.text(value)
        if role == Qt.ItemDataRole.ToolTipRole and column.tooltip is not None:
            return column.tooltip(value)
        if role == Qt.ItemDataRole.ForegroundRole and column.color is not None:
            name = column.color(value)
            return QColor(name) if name else None
        if role == Qt.ItemDataRole.TextAlignmentRole:
            return int(_ALIGN_RIGHT if column.numeric else _ALIGN_LEFT)
        if role == ROW_KEY_ROLE:
            return key
        if role == ROW_VALUE_ROLE:
            return value
        return None

    def headerData(self, section: int, orientation: Qt.Orientation,
                   role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if orientation == Qt.Orientation.Horizontal and 0 <= section < len(self.columns):
            if role == Qt.ItemDataRole.DisplayRole:
                return self.columns[section].title
            if role == Qt.ItemDataRole.ToolTipRole:
                return self.columns[section].header_tip
        if orientation == Qt.Orientation.Vertical and role == Qt.ItemDataRole.DisplayRole:
            return section + 1
        return None

    # --- keyed updates (called from node observer callbacks, on the loop = Qt thread) ---

    def upsert(self, key: Hashable, value: Any) -> None:
        """Insert a row for a new key, or replace the value of an existing one."""
        if key in self._values:
            self._values[key] = value
            self.refresh(key)
            return
        row = 0 if self.newest_first else len(self._keys)
        self.beginInsertRows(QModelIndex(), row, row)
        self._keys.insert(row, key)
        self._values[key] = value
        self.endInsertRows()
        self._trim()

    def refresh(self, key: Hashable) -> None:
        """Tell views the row changed (its value object was updated in place)."""
        row = self.row_of(key)
        if row >= 0:
            self.dataChanged.emit(self.index(row, 0), self.index(row, len(self.columns) - 1))

    def remove(self, key: Hashable) -> None:
        """Drop a row (no-op for an unknown key)."""
        row = self.row_of(key)
        if row < 0:
            return
        self.beginRemoveRows(QModelIndex(), row, row)
        del self._keys[row]
        del self._values[key]
        self.endRemoveRows()

    def replace_all(self, items: Iterable[tuple[Hashable, Any]]) -> None:
        """Reset the table to these rows (in the given order)."""
        self.beginResetModel()
        self._keys, self._values = [], {}
        for key, value in items:
            if key not in self._values:
                self._keys.append(key)
            self._values[key] = value
        self.endResetModel()
        self._trim()

    def _trim(self) -> None:
        if not self.max_rows or len(self._keys) <= self.max_rows:
            return
        if self.newest_first:
            first, last = self.max_rows, len(self._keys) - 1
        else:
            first, last = 0, len(self._keys) - self.max_rows - 1
        self.beginRemoveRows(QModelIndex(), first, last)
        for key in self._keys[first:last + 1]:
            del self._values[key]
        del self._keys[first:last + 1]
        self.endRemoveRows()

    # --- reading ---

    def row_of(self, key: Hashable) -> int:
        """The row index of a key, or -1."""
        try:
            return self._keys.index(key)
        except ValueError:
            return -1

    def key_at(self, row: int) -> Hashable | None:
        return self._keys[row] if 0 <= row < len(self._keys) else None

    def value(self, key: Hashable) -> Any:
        return self._values.get(key)

    def keys(self) -> list[Hashable]:
        return list(self._keys)

    def values(self) -> list[Any]:
        return [self._values[k] for k in self._keys]

    def cell_text(self, key: Hashable, title: str) -> str | None:
        """The text shown in one cell (for tests and the summary line)."""
        value = self._values.get(key)
        for column in self.columns:
            if column.title == title and value is not None:
                return column.text(value)
        return None
