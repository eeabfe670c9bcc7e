"""GGUF files: facts from a header (local or remote), and tiny random-weight models for tests and the demo."""

from llmgw.gguf._header import GGUFError, Header, read_header, read_model, split_parts
from llmgw.gguf._tiny import TinyLlama, write_random_llama

__all__ = ["GGUFError", "Header", "TinyLlama", "read_header", "read_model", "split_parts", "write_random_llama"]
