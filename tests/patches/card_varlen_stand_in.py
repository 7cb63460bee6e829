"""FlashAttention's variable-length kernel's CPU stand-in (flash_varlen_on_a_cpu.py) registered in every process, so
that bench.py --mode=card's varlen check runs on a CPU as on a GPU (in the card's child process that runs it)."""
import flash_varlen_on_a_cpu

flash_varlen_on_a_cpu.varlen_attn()
