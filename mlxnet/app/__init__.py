"""Interactive erasing and the local web app.

- :mod:`.regions`: masks from prompts (SAM's best mask for points or a box, every instance of a
  YOLOv8 class) and their dilation; the click path upsamples only the chosen mask.
- :mod:`.erasing`: LaMa on a crop around the mask, resized when large, pasted back.
- :mod:`.models`: the models, each loaded on first use, once per process, and shared.
- :mod:`.server`, :mod:`.command`: ``mlxnet app``, a Starlette application behind uvicorn (the
  ``app`` extra), imported only when the command runs.

Nothing here changes global state on import; only :mod:`.server` needs the web stack.
"""
