"""GGUF files: tiny random-weight models for tests and the demo (reading headers comes next)."""

from llmgw.gguf._tiny import TinyLlama, write_random_llama

__all__ = ["TinyLlama", "write_random_llama"]
