"""``python -m semantic``: the ``semantic`` command, for an environment whose scripts are
not on the PATH."""

from __future__ import annotations

import sys

from semantic.adapters.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
