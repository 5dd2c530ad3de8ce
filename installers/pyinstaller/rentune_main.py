"""The bundled app's entry point: the same ``rentune`` command as the installed package's script."""

import multiprocessing
import sys

from desktop.cli import main

if __name__ == "__main__":
    multiprocessing.freeze_support()  # a frozen program that starts workers must call this first (Windows, macOS)
    sys.exit(main())
