"""Host libraries' own test suites run against the project's drop-ins (``nox -s django``)."""
