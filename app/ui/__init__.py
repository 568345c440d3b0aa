"""Windows, tabs and the Qt table models they show (one QAbstractTableModel per collection)."""
