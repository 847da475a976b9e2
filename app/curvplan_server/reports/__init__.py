"""Job report pages: server-rendered HTML with SVG plots, and signed links.

``svg`` draws, ``plots`` turns a job into plots, ``page`` into an HTML document,
``files`` into files on disk (``curvplan report --out``), ``router`` serves them.
Nothing here imports torch.
"""
