"""``python -m tfcluster``: the same as the ``tfcluster`` command."""
import sys

from .cli import main

sys.exit(main())
