"""The ``trtpack`` command line: ``app`` (the typer app, its options, ``main``), one module per
command group over the library (``build``, ``diagnostics``, ``outputs``, ``recipes``,
``cache``), ``exits`` (an error as one line and its exit code), and the rendering:
``console`` and ``views``. The library never prints; only this package does."""


def main() -> None:
    """The ``trtpack`` console script (``trtpack.cli:main`` in pyproject.toml)."""
    from trtpack.cli.app import main as run

    run()
