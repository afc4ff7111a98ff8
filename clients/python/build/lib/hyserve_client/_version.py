"""Version of the hyserve-client distribution (read by pyproject.toml)."""

__version__ = "0.1.0"
