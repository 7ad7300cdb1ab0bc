"""How rows land in a table: the shadow and apply statements of overwrite, replaceWhere and change-data, and
the table's schema."""
