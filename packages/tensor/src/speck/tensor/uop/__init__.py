"""speck.uop under tinygrad's module name (`tinygrad.uop`, `tinygrad.uop.ops`)."""
