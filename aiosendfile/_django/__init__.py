"""The Django door: Django's ASGI handler with file bodies that leave as files, and static files."""
