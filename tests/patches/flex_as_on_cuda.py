"""FlexAttention as on CUDA, on the CPU stand-in of flex_on_a_cpu.py, which refuses what the CUDA kernel's compilation
refuses: GPT's flex_kernel None (attention_kernel='auto') becomes True, so GPT.flex_runs picks FlexAttention for
windows in blocks where it would on CUDA (blocks of a multiple of 128, heads of a power of 2 from 16, no dropout). At
exit, `flex kernel calls: N` on stderr counts its calls."""
import atexit
import sys

import flex_on_a_cpu
import model

flex_on_a_cpu.use()
build = model.GPT.__init__
model.GPT.__init__ = lambda self, config, flex_kernel=None, **options: build(
    self, config, flex_kernel=True if flex_kernel is None else flex_kernel, **options)
atexit.register(lambda: print(f'flex kernel calls: {len(flex_on_a_cpu.calls)}', file=sys.stderr))
