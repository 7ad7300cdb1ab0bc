"""The decision log: its tables, the parts of multi-target transactions, and what each batch writes."""
