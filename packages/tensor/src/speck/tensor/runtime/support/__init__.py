"""tinygrad.runtime.support: runtime helpers under tinygrad's names (`compiler_cuda`)."""
