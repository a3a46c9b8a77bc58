"""The execution engine under tinygrad's module names: `engine.jit` (TinyJit), `engine.realize` (running
schedules), `engine.schedule` (tensor graphs -> kernels). The code lives in speck.tensor.jit, .realize, .schedule."""
