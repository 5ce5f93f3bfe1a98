"""triemask's applications, apart from the library: the command line (``triemask``,
``python -m triemask``), the demo, the evaluation, the default model and the shared-prefix
generator they use. Nothing in the library imports this package."""
