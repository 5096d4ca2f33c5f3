"""lakelog: the CLI and the settings that compose the packages."""

__version__ = "0.1.0"
