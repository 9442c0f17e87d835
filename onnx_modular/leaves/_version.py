"""The package version, in a leaf so that every module may read it."""

__version__ = "0.1.0"
