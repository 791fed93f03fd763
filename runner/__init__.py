"""runner: launches a fixed-variable campaign of parallel layouts and records raw artifacts."""
__version__ = "0.1.0"
