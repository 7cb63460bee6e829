"""GPT.varlen_kernel picks torch's varlen_attn, FlashAttention's variable-length kernel, on the CPU kernels of
flash_varlen_on_a_cpu.py, as on an Ampere GPU; at exit, `flash kernel calls: N` on stderr counts its forward calls."""
import atexit
import sys

import flash_varlen_on_a_cpu as flash
import model

kernel_forward, calls = flash.forward, []
flash.forward = lambda *args, **kwargs: calls.append(1) or kernel_forward(*args, **kwargs)
kernel = flash.varlen_attn()
model.GPT.varlen_kernel = lambda self, idx: kernel
atexit.register(lambda: print(f'flash kernel calls: {len(calls)}', file=sys.stderr))
