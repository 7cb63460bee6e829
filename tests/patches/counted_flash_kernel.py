"""FlashAttention's variable-length kernel as on an Ampere GPU, on the CPU kernels of flash_varlen_on_a_cpu.py, which
refuse what the CUDA one refuses: GPT's kernels are built with flash=True (where None: as on CUDA), so
Kernels.varlen_kernel picks torch's varlen_attn where it would on CUDA (bf16 or fp16, heads it takes, no dropout), and
GPT2026 likewise (training.runs.record_options). At exit, `flash kernel calls: N` on stderr counts its forward calls.
FLASH_FULL_PRECISION=1: the kernel runs in fp32 and fp64 too, which Kernels.varlen_kernel and the CUDA kernel refuse
(flash_varlen_on_a_cpu.full_precision), for a run compared with another to more digits than bf16 keeps."""
import atexit
import os
import sys

import flash_varlen_on_a_cpu as flash
from training import attention, runs

kernel_forward, calls = flash.forward, []
flash.forward = lambda *args, **kwargs: calls.append(1) or kernel_forward(*args, **kwargs)
kernel = flash.varlen_attn()
build = attention.Kernels.__init__
attention.Kernels.__init__ = lambda self, flash=None, flex=None: build(self, True if flash is None else flash, flex)
record_options = runs.record_options
runs.record_options = lambda config, model_args, flash_kernel=None: record_options(
    config, model_args, True if flash_kernel is None else flash_kernel)
if os.environ.get('FLASH_FULL_PRECISION') == '1':
    attention.Kernels.varlen_kernel = lambda self, device, dtype, head_size: kernel
    flash.accepted_dtypes = flash.FULL_PRECISION_DTYPES  # full_precision() for the whole run
atexit.register(lambda: print(f'flash kernel calls: {len(calls)}', file=sys.stderr))
