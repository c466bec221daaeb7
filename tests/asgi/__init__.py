"""The ASGI door's tests: ``aiosendfile.asgi`` (StaticFiles, FileResponse) and ``aiosendfile.uvicorn``
(our uvicorn protocols, ``thread_write``), in process and under real ASGI servers."""
