"""tinygrad.runtime.ops_python: speck.hcq's PYTHON device (`PythonDevice`, `PythonProgram`: programs run by
speck.codegen's reference interpreter) and its renderer, speck.codegen's `PythonRenderer`."""

from speck.codegen.renderer.python import PythonRenderer
from speck.hcq.python_device import PythonDevice, PythonProgram

__all__ = ["PythonDevice", "PythonProgram", "PythonRenderer"]
