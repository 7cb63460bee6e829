"""What train.py, sample.py, bench.py and estimate_memory.py are built on, one concern a module:

rules.py       what train.py accepts and which model a config builds (shared with the memory estimate)
checkpoint.py  ckpt.pt: atomic saves, one-line errors on load
optim.py       the optimizers (`optim`), their updates on bf16 weights, the step fused into backward
parallel.py    the `parallelism` modes under torchrun, the full-tensor checkpoint, timeouts and the launcher watch
schedule.py    the learning rate schedule
device.py      default device and dtype, their checks, the GPUs' peak FLOPS for MFU
allocator.py   train.py's CUDA allocator settings, applied before torch's import (train.py, bench.py)
memory/        the memory tracer, the estimate before launch, the advice after an out-of-memory error
hellaswag.py   HellaSwag's validation set and its scoring (hellaswag.py, train.py's hellaswag key)
paths.py       where relative paths point, and the check that out_dir can be written
errors.py      ConfigError and fail(): one line, exit status 2
phase_log.py   train.py's phase_log: a JSON line as each phase begins, with its time and peak memory
card.py        bench.py --mode=card: its parts, their order and fingerprints, each in a child process (card_child.py):
               its checks (card_checks.py), the device and nanoGPT's path (card_measure.py), train.py on each preset
               under its card's cap (card_train.py), the profile (card_profile.py); its report (card_report.py)
"""
