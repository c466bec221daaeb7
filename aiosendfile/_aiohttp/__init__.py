"""The aiohttp door: ``FileResponse``, the static resource and ``save_upload``.

Public through :mod:`aiosendfile.aiohttp`; a docstring only, so importing it loads no aiohttp.
"""
