"""tfcluster's version: one string, read by the package, the CLI and the packaging metadata."""

__version__ = "0.1.0"
