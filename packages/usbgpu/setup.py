"""Build glue for speck-usbgpu: the two cffi modules (async helper and simulator fake libusb) from c_helpers/.

Everything else lives in pyproject.toml; setuptools needs this file only for `cffi_modules`.
"""

from setuptools import setup

setup(
    cffi_modules=[
        "src/speck/usbgpu/_build_helper.py:ffibuilder",
        "src/speck/usbgpu/_build_helper.py:fake_ffibuilder",
    ],
)
