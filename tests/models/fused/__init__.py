"""Tests of the fused Triton kernels, run on CPU tensors through Triton's interpreter: the variable is
set here, before any kernel module is imported (Triton reads it when a kernel is defined)."""

import os

os.environ["TRITON_INTERPRET"] = "1"
