"""The ``trtpack`` command line: ``app`` (the typer app, the error handling) and one module per
command group over the library; ``console`` and ``views`` render."""
