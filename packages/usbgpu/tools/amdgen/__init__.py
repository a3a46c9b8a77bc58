"""The pieces of gen_amd_tables.py: which kernel headers are read, what speck uses from them, how the C is
parsed and how the Python table module is written."""

from __future__ import annotations
