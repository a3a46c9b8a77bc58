"""Runnable examples; `python -m speck.tensor.examples.train` is the README's main job."""
