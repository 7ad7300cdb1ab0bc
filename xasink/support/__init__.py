"""Support: fault points, phase timings, password masking, user notices, and the embedded PostgreSQL server."""
