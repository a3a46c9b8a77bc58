"""tinygrad's `tinygrad.llm` module path: the GGUF reader lives in speck.tensor.nn.gguf."""
