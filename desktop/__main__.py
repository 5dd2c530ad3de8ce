"""Allows ``python -m desktop``, the same as the ``rentune`` command."""

import sys

from desktop.cli import main

if __name__ == "__main__":
    sys.exit(main())
