"""tinygrad.runtime: the device modules under tinygrad's names (`ops_cpu`, `ops_disk`, `ops_python`, `ops_null`,
`support.compiler_cuda`); each re-exports the speck.hcq device kind it names."""
