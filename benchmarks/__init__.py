"""Side-by-side measurements of xasink against the usual ways of writing from Spark (``python -m benchmarks.run``)."""
