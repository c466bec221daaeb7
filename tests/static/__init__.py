"""The static-file core's tests (``aiosendfile._static``): its rules alone, the golden table, the
directory policy, each run against the doors that answer from it."""
