"""`tinygrad.llm.gguf`: gguf_load (speck.tensor.nn.gguf, also exported by nn.state)."""

from speck.tensor.nn.gguf import gguf_load

__all__ = ["gguf_load"]
