"""bench.py --mode=card on a CPU with FlashAttention's variable-length kernel's CPU stand-in (flash_varlen_on_a_cpu.py),
so that the card's varlen check runs there as on a GPU."""
import functools
import os
import sys

if os.path.basename(sys.argv[0]) == 'bench.py': # not in the card's children, which inherit the patches
    import flash_varlen_on_a_cpu
    from training import card

    card.run = functools.partial(card.run, varlen_kernel=flash_varlen_on_a_cpu.varlen_attn)
