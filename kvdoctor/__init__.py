"""kvdoctor: says why LLM decode is slow."""

__version__ = "0.1.0"
