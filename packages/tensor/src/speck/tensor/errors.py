"""Exception classes of bad Tensor arguments. tinygrad raises the builtin class named in TENSOR_API (ValueError for
a bad reshape, IndexError for shapes that don't broadcast, AssertionError for a bad cat...); speck's own errors have
always been RuntimeErrors. Each class here is both, so code written against either keeps catching what it expects.
Every exception speck.tensor defines lives here and derives from `TensorError` (the modules that raise them
re-export their own, so `from speck.tensor.jit import JitError` keeps working)."""

from __future__ import annotations

import pickle

from speck.hcq.errors import DeviceNotFoundError
from speck.uop.errors import UnknownDTypeError, reduce_error


class TensorError(Exception):
    """Base of every exception speck.tensor defines (each also derives from the builtin class users catch)."""

    __reduce__ = reduce_error  # pickles class, args and attributes (errors cross process boundaries)


class TensorValueError(ValueError, RuntimeError, TensorError):
    """A bad value for an argument (reshape size, shrink bounds, pad amounts, rand bounds...)."""


class TensorIndexError(IndexError, RuntimeError, TensorError):
    """A dim, index or shape that is out of range or doesn't broadcast."""


class IndexOutOfBoundsError(TensorIndexError):
    """An index tensor held a value outside the indexed dim (found by the device-side check CHECK_OOB turns on,
    raised at the next read of data): the message names the op, the index and the bound."""


class TensorAssertionError(AssertionError, RuntimeError, TensorError):
    """A violated precondition that tinygrad checks with `assert` (cat shapes, item() of several elements...)."""


class TensorTypeError(TypeError, RuntimeError, TensorError):
    """An argument of the wrong kind (non-int randint bounds, a float Embedding index...)."""


class TensorOverflowError(OverflowError, RuntimeError, TensorError):
    """A value that doesn't fit the requested dtype (an arange range beyond it)."""


class TensorNotImplementedError(NotImplementedError, TensorError):
    """A mode tinygrad doesn't implement (NotImplementedError is already a RuntimeError)."""


class TensorDTypeError(UnknownDTypeError, TensorError):
    """A dtype argument that names no dtype (a string, a numpy type with no speck equivalent). Also speck.uop's
    UnknownDTypeError (an AttributeError and a RuntimeError), which the lookup raised."""


class UnknownDeviceError(DeviceNotFoundError, TensorError):
    """A device name no backend registers; the message lists the known ones. Also speck.hcq's DeviceNotFoundError
    (a KeyError and an HCQError), which the lookup raised."""


class TensorKeyError(KeyError, TensorError):
    """A name with no entry (a numpy or torch dtype with no speck equivalent); the message lists what exists."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class NumpyDTypeError(TensorTypeError, KeyError):
    """A numpy array whose dtype no tensor can have (complex, str, object): tinygrad's dtype lookup raises KeyError,
    so this is a KeyError too, and a TypeError (the wrong kind of data)."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class TensorZeroDivisionError(ZeroDivisionError, ValueError, TensorError):
    """A size that can't be inferred because it would divide by zero (reshape's -1 next to a 0 dim, as in
    tinygrad); a ValueError too, like the other bad reshapes."""


class TensorFileNotFoundError(FileNotFoundError, TensorError):
    """A file that a Tensor, a loader or from_url was pointed at does not exist."""


class SaveError(OSError, TensorError):
    """A file a saver writes (safe_save) can't be written: a missing directory, a directory in its place, no
    permission, a full disk. An OSError with the OS's errno; the message names the path and what to do."""


class FetchError(ConnectionError, TensorError):
    """A download (fetch, from_url) failed: no connection, or an HTTP error status."""


class TensorImportError(ImportError, TensorError):
    """speck.tensor can't be imported as installed (a sibling package too old)."""


class TensorRuntimeError(RuntimeError, TensorError):
    """An operation that can't run in the current state rather than because of one bad argument: the interpreter
    lacks something speck.tensor needs, a module is already imported, a graph node no rule handles."""


class GradientError(RuntimeError, TensorError):
    """A gradient that can't be computed: a non-float tensor, an op with no gradient rule."""


class JitError(RuntimeError, TensorError):
    """A jitted function was called in a way its capture can't serve, or did something a capture can't record."""


class JitResetError(JitError, AssertionError):
    """reset() of a TinyJit that has no function (an unpickled capture): it could never capture again."""


class GradientSeedError(GradientError, AssertionError):
    """A non-scalar tensor was differentiated without a `gradient=` seed (an AssertionError in tinygrad too)."""


class OptimizerError(RuntimeError, AssertionError, TensorError):
    """An optimizer was built or stepped in a way it can't serve (an AssertionError in tinygrad too)."""


class DatasetError(RuntimeError, TensorError):
    """A dataset file is missing, truncated or not an IDX file."""


class CheckpointError(ValueError, RuntimeError, TensorError):
    """A model file that can't be read as its format says (malformed, truncated, hostile or beyond a size limit);
    the message names the file and what is wrong. Base of each format's error class."""


class SafetensorsError(CheckpointError):
    """A safetensors file is malformed; the message names the file and what is wrong."""


class SafetensorsDTypeError(SafetensorsError, KeyError):
    """safe_save of a dtype the safetensors format has no name for (the fnuz fp8 kinds): a KeyError too, as
    tinygrad's lookup of the name raises."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class GGUFError(CheckpointError):
    """A GGUF file is malformed, truncated, or uses a type gguf_load can't read."""


class ArchiveError(CheckpointError):
    """A tar or zip archive that is malformed, or a member that expands beyond MAX_DECOMPRESSED_BYTES."""


class TorchLoadError(CheckpointError):
    """A PyTorch checkpoint that is malformed: bad pickle, a missing storage, a view outside its storage..."""


class UnsafePickleError(TorchLoadError, pickle.UnpicklingError):
    """A checkpoint's pickle names a global that torch_load does not allow (like torch.load(weights_only=True)):
    raised when the name is read, before anything it would run."""


class StateDictKeyError(RuntimeError, KeyError, TensorError):
    """A model key is missing from the state dict (strict loading)."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class StateDictShapeError(RuntimeError, ValueError, TensorError):
    """A state-dict tensor's shape differs from the model tensor's."""


class CustomKernelError(RuntimeError, TensorError):
    """A hand-written kernel that can't be built or run as written."""


class ShardingError(RuntimeError, AssertionError, TensorError):
    """An operation that a sharded tensor can't do along its sharded axis (tinygrad raises RuntimeError for some
    of these and AssertionError for others: this is both)."""


class KernelCountException(AssertionError, TensorError):
    """A block ran a different number of kernels than the test expected."""

    def __init__(self, expected: int, got: int) -> None:
        super().__init__(f"expected {expected} kernel(s), got {got}")
        self.expected, self.got = expected, got


class DeviceUsageError(RuntimeError, AssertionError, TensorError):
    """Kernels were about to run where running is not allowed (ALLOW_DEVICE_USAGE=0: an @function body is being
    traced). An AssertionError too, like tinygrad's check."""


class FunctionError(RuntimeError, TensorError):
    """An @function that can't be captured as written."""


class DistributedError(RuntimeError, TensorError):
    """A collective between ranks failed: a rank was lost, did not answer in time, or MPI reported an error."""


class TensorPickleError(pickle.PicklingError, RuntimeError, TensorError):
    """A tensor, buffer or TinyJit that can't be pickled (or unpickled here), with the reason."""


class JitNotCapturedError(TensorPickleError, AssertionError):
    """Pickling a TinyJit before it captured (tinygrad raises AssertionError there)."""
