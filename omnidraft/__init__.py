"""omnidraft: one small drafter that speeds up any target LLM, whatever its tokenizer."""

__version__ = "0.1.0"
