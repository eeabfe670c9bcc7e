"""GGUF files: facts from a header (local or remote), tiny random-weight models for tests and the
demo, LoRA adapters checked against their model (and random ones written), and a BERT embedding
model's Hugging Face files written as GGUF."""

from llmgw.gguf._bert import write_bert
from llmgw.gguf._header import GGUFError, Header, bytes_per_weight, read_header, read_model, split_parts
from llmgw.gguf._lora import Lora, check_lora, write_random_lora
from llmgw.gguf._tiny import TinyLlama, write_random_llama

__all__ = [
    "GGUFError",
    "Header",
    "Lora",
    "TinyLlama",
    "bytes_per_weight",
    "check_lora",
    "read_header",
    "read_model",
    "split_parts",
    "write_bert",
    "write_random_llama",
    "write_random_lora",
]
