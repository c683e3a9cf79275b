"""``python -m tfcluster``: the same as the ``tfcluster`` command."""
from .cli import run

run()
