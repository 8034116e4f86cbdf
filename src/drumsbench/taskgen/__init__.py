"""Tasks made from real projects' own test suites (``drumsbench tasks make``, docs/taskgen.md):
``projects`` (the pinned sdists), ``mutate`` (procedural bugs), ``make`` (validation by the
project's own suite in a sandbox), ``task_folder`` (Harbor task folders)."""
