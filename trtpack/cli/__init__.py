"""The ``trtpack`` command line: ``app`` (the typer app, its options, ``main``), one module per
command group over the library (``build``, ``diagnostics``, ``outputs``, ``recipes``,
``cache``), ``exits`` (an error as one line and its exit code), and the rendering:
``console`` and ``views``. The library never prints; only this package does."""


def main() -> None:
    """The ``trtpack`` console script (``trtpack.cli:main`` in pyproject.toml). A build's
    first stage process starts first (``pipeline.prestart``): it imports torch while the
    command line is imported and the build is planned."""
    import sys

    from trtpack.pipeline.prestart import end_untaken, prestart

    prestart(sys.argv[1:])
    try:
        from trtpack.cli.app import main as run

        run()
    finally:  # a command that ended before its build took it (a usage error, Ctrl-C)
        end_untaken()
