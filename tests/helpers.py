"""Shared by the tests: a tiny character dataset in nanoGPT's format, the arguments of a tiny model, a subprocess
runner and a parser of train.py's log lines."""
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DATASET = 'tiny_char'
TEXT = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n"
        "First Citizen:\nYou are all resolved rather to die than to famish?\n\nAll:\nResolved. resolved.\n\n") * 60
# a 2-layer, 32-wide model on 16-character windows: a few milliseconds a step on a CPU
TINY_ARGS = ['--device=cpu', '--dtype=float32', '--compile=False', f'--dataset={DATASET}', '--n_layer=2',
             '--n_head=2', '--n_embd=32', '--block_size=16', '--batch_size=4', '--gradient_accumulation_steps=1',
             '--dropout=0.0', '--bias=False', '--learning_rate=1e-2', '--min_lr=1e-3', '--warmup_iters=2',
             '--lr_decay_iters=100', '--eval_iters=2', '--log_interval=1', '--wandb_log=False']


def write_char_dataset(data_dir, name=DATASET, text=TEXT, vocab_size=None):
    """nanoGPT's shakespeare_char format in data_dir/name: uint16 train.bin/val.bin (90/10) and meta.pkl.
    vocab_size overrides the one written to meta.pkl (to fake a larger vocabulary)."""
    chars = sorted(set(text))
    stoi = {ch: i for i, ch in enumerate(chars)}
    ids = np.array([stoi[ch] for ch in text], dtype=np.uint16)
    path = Path(data_dir) / name
    path.mkdir(parents=True, exist_ok=True)
    cut = int(len(ids) * 0.9)
    ids[:cut].tofile(path / 'train.bin')
    ids[cut:].tofile(path / 'val.bin')
    meta = {'vocab_size': vocab_size or len(chars), 'itos': dict(enumerate(chars)), 'stoi': stoi}
    with open(path / 'meta.pkl', 'wb') as f:
        pickle.dump(meta, f)
    return path


def run_script(script, *args, env=None, timeout=300):
    """Run python ROOT/script with args from ROOT, as a user would; the CompletedProcess, output captured.
    One thread per process: the tests share two cores, and runs compared bit for bit use the same setting."""
    return subprocess.run([sys.executable, str(ROOT / script), *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, 'OMP_NUM_THREADS': '1', **(env or {})})


def logged_losses(stdout, kind='iter'):
    """{iteration: loss} of train.py's `iter N: loss X` lines (kind='iter') or `step N: ... val loss X` lines
    (kind='step'), parsed as nanoGPT users' scripts do."""
    losses = {}
    for line in stdout.splitlines():
        if kind == 'iter' and line.startswith('iter '):
            losses[int(line.split(':')[0][5:])] = float(line.split('loss ')[1].split(',')[0])
        elif kind == 'step' and line.startswith('step '):
            losses[int(line.split(':')[0][5:])] = float(line.split('val loss ')[1])
    return losses
