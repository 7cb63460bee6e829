"""What train.py, sample.py, bench.py and estimate_memory.py are built on, one concern a module:

configurator.py nanoGPT's configurator as a function: config files, --key=value, --help
rules.py        what train.py accepts and which model a config builds (shared with the memory estimate)
checkpoint.py   ckpt.pt: atomic saves, one-line errors on load
optim.py        the `optim` key: what each optimizer needs and refuses, its parameter groups, schedule and build
optimizers.py   the optimizer classes: AdamW on bf16 moments or weights, 8-bit, Muon, the step fused into backward
parallel.py     the `parallelism` modes under torchrun, the full-tensor checkpoint, timeouts and the launcher watch
schedule.py     the learning rate schedule
step.py         the model and optimizer a config builds, and train.py's training step
runs.py         what differs per model_file in train.py's loop: model.py's GPT, or gpt2026.py's record
record2026.py   the 24 Jan 2026 record's schedules and optimizer (NorMuon, Adam every other step)
documents.py    rows that start at documents, as the 24 Jan 2026 record reads FineWeb
device.py       default device and dtype, their checks, the GPUs' peak FLOPS for MFU
allocator.py    train.py's CUDA allocator settings, applied before torch's import (train.py, bench.py)
memory/         the memory tracer, the estimate before launch and what fits a card, the advice after an out-of-memory
                error
hellaswag.py    HellaSwag's validation set and its scoring (hellaswag.py, train.py's hellaswag key)
paths.py        where relative paths point, and the check that out_dir can be written
errors.py       ConfigError and fail(): one line, exit status 2
phase_log.py    train.py's phase_log: a JSON line as each phase begins, with its time and peak memory
card.py         bench.py --mode=card: its parts, their order and fingerprints, each in a child process (card_child.py):
                its checks (card_checks.py), the device and nanoGPT's path (card_measure.py), train.py on each preset
                under its card's cap (card_train.py), the profile (card_profile.py); its report (card_report.py)
"""
