"""eagle3kit: exact training data, crash-safe datasets and acceptance forecasts for EAGLE-3."""

__version__ = "0.1.0"
