"""The operator's tools: the ``xasink`` command, the survey behind ``recover`` and ``status``, alerts,
Prometheus, DDL."""
