"""Triton kernels of the triton attention backend, one module per kernel family.

Every kernel also runs on CPU tensors in Triton's interpreter (`TRITON_INTERPRET=1`), which is how the tests
check them against the torch_native backend.
"""
