"""The Django door's tests: ``aiosendfile.django`` under real ASGI servers, and its request threads."""
