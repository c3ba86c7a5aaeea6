"""The op vocabulary (``ops``), its pure-torch oracle (``reference``) and its backends (``triton``, ``aiter``)."""
