"""``serve``'s tests: its HTTP/1.1 engine (``aiosendfile._serve``) in the test's loop or its own
process, its TLS, auth, upload and form, its command line, and hostile clients."""
