"""Every exception class of every speck errors module survives a pickle round trip unchanged: the same class, message,
args and attributes. Errors cross process boundaries (compile workers, multiprocessing pools, a test's child process),
and a round trip that rebuilt the message from the formatted text (UsbError's "... failed failed") or failed to
rebuild at all (a class whose __init__ takes other arguments than its args) would mislead whoever reads it."""

from __future__ import annotations

import importlib
import inspect
import pathlib
import pickle
from typing import Any

import pytest

MODULES = ("speck.uop.errors", "speck.codegen.errors", "speck.hcq.errors", "speck.tensor.errors", "speck.usbgpu.errors")


def _sample(annotation: str, name: str) -> Any:
    """A value for a constructor parameter, chosen from its (string) annotation."""
    from speck.codegen.errors import EntryProblem
    from speck.uop import Ops, dtypes

    kind = annotation.replace(" | None", "").strip()
    samples: dict[str, Any] = {
        "str": f"<{name}>",
        "int": 7,
        "float": 1.5,
        "bool": True,
        "object": f"<{name} record>",
        "list[str]": [f"<{name} 0>", f"<{name} 1>"],
        "Ops": Ops.ADD,
        "DType": dtypes.float32,
        "EntryProblem": EntryProblem(pathlib.Path("/tmp/entry"), "truncated"),
    }
    if kind not in samples:
        raise AssertionError(f"no sample value for parameter {name}: {annotation}; add one to _sample")
    return samples[kind]


def _instance(cls: type[BaseException]) -> BaseException:
    """An instance built the way speck builds it: through the class's own __init__ signature."""
    init = cls.__init__
    if init is BaseException.__init__ or inspect.getmodule(init) is None or not inspect.isfunction(init):
        return cls(f"a {cls.__name__} message")
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for p in list(inspect.signature(init).parameters.values())[1:]:
        if p.kind is p.VAR_POSITIONAL:
            args.append(f"a {cls.__name__} message")
        elif p.kind is p.VAR_KEYWORD:
            continue
        elif p.kind is p.KEYWORD_ONLY:
            kwargs[p.name] = _sample(str(p.annotation), p.name)
        else:
            args.append(_sample(str(p.annotation), p.name))
    return cls(*args, **kwargs)


def _classes() -> list[type[BaseException]]:
    found = []
    for module_name in MODULES:
        module = importlib.import_module(module_name)
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and issubclass(value, BaseException)
                and value.__module__ == module_name
                and not issubclass(value, Warning)
            ):
                found.append(value)
    return found


@pytest.mark.parametrize("cls", _classes(), ids=lambda c: f"{c.__module__}.{c.__name__}")
def test_error_pickle_round_trip(cls: type[BaseException]) -> None:
    err = _instance(cls)
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is cls
    assert str(back) == str(err)
    assert back.args == err.args
    assert vars(back) == vars(err)


def test_usb_error_message_not_doubled() -> None:
    from speck.usbgpu.errors import TransferStallError, UsbError, error_for_status

    err = error_for_status(4, "bulk OUT 0x02 (4096 bytes)", 0, 4096, tag=3)
    back = pickle.loads(pickle.dumps(err))
    assert isinstance(back, TransferStallError) and isinstance(back, UsbError)
    assert str(back).count(" failed") == 1, str(back)
    assert (back.operation, back.detail, back.tag, back.code) == (err.operation, err.detail, 3, 4)


def test_error_with_cause_and_notes_round_trips() -> None:
    from speck.usbgpu.errors import GpuHang

    err = GpuHang("compute dispatch", "compute queue", "wave stuck at pc 0x40")
    err.add_note("while running kernel E_4")
    back = pickle.loads(pickle.dumps(err))
    assert str(back) == str(err) and back.__notes__ == ["while running kernel E_4"]
    assert (back.queue, back.status) == ("compute queue", "wave stuck at pc 0x40")
