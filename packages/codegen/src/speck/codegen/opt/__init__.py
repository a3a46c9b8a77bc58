"""placeholder"""
from speck.uop import UOp


def optimize_kernel(sink: UOp, renderer: object) -> UOp:
    return sink
