"""The Prefect gate's tests. ``prefect_suite/`` is Prefect's own task tests, vendored: they run in a
subprocess with their own settings (test_prefect_suite.py), never in this session."""

collect_ignore = ["prefect_suite"]
