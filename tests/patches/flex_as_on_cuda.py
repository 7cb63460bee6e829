"""FlexAttention as on CUDA, on the CPU stand-in of flex_on_a_cpu.py, which refuses what the CUDA kernel's compilation
refuses: GPT's kernels' flex None (attention_kernel='auto') becomes True, so Kernels.flex_runs picks FlexAttention for
windows in blocks where it would on CUDA (blocks of a multiple of 128, heads of a power of 2 from 16, no dropout). At
exit, `flex kernel calls: N` on stderr counts its calls."""
import atexit
import sys

import flex_on_a_cpu
from training import attention

flex_on_a_cpu.use()
build = attention.Kernels.__init__
attention.Kernels.__init__ = lambda self, flash=None, flex=None: build(self, flash, True if flex is None else flex)
atexit.register(lambda: print(f'flex kernel calls: {len(flex_on_a_cpu.calls)}', file=sys.stderr))
