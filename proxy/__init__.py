"""omniroute proxy: the resilience engine and the OpenAI-compatible server."""

__version__ = "0.1.0"
