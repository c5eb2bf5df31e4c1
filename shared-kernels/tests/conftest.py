"""Without CUDA, Triton kernels are tested in the interpreter; the variable must be set before triton loads."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
