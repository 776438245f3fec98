"""``python -m trtpack.cli``: the same as the ``trtpack`` command."""

from trtpack.cli import main

if __name__ == "__main__":
    main()
