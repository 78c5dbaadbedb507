"""mtp-farm: a regression farm for speculative decoding (MTP) on LLM inference engines."""

__all__ = ["__version__"]
__version__ = "0.1.0"
