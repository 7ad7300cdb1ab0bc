"""Issue 38's generated values matrix against Spark's JDBC writer: cells.py (the cells), listed.py (the
accepted differences, docs/types.md's source), run.py (batches, the oracle); tests/test_values_matrix.py."""
