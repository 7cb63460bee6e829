"""Shared by the tests: a tiny character dataset in nanoGPT's format, a tiny GPT and train.py's step on it, the
arguments of a tiny model, subprocess runners, a parser of train.py's log lines, and a tiny stand-in for GPT-2's
BPE."""
import atexit
import functools
import hashlib
import itertools
import json
import os
import pickle
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import tiktoken
import torch

from model import GPT, GPTConfig
import script_server
from training.step import Prefetcher, train_step

ROOT = Path(__file__).resolve().parent.parent
PATCHES = ROOT / 'tests' / 'patches'  # patched_env's modules
PLAIN_SUBPROCESS = 'TESTS_PLAIN_SUBPROCESS'
DATASET = 'tiny_char'
TEXT = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n"
        "First Citizen:\nYou are all resolved rather to die than to famish?\n\nAll:\nResolved. resolved.\n\n") * 60
# a 2-layer, 32-wide model on 16-character windows: a few milliseconds a step on a CPU
TINY_ARGS = ['--device=cpu', '--dtype=float32', '--compile=False', f'--dataset={DATASET}', '--n_layer=2',
             '--n_head=2', '--n_embd=32', '--block_size=16', '--batch_size=4', '--gradient_accumulation_steps=1',
             '--dropout=0.0', '--bias=False', '--learning_rate=1e-2', '--min_lr=1e-3', '--warmup_iters=2',
             '--lr_decay_iters=100', '--eval_iters=2', '--log_interval=1', '--wandb_log=False']


def tiny_gpt(seed=0, **config):
    """A GPT of 2 layers, 2 heads, 16 wide, on 16-token windows of a 50-token vocabulary (GPTConfig's defaults
    otherwise); config overrides GPTConfig's keys. Seeded: one seed, one set of weights."""
    torch.manual_seed(seed)
    return GPT(GPTConfig(**{'n_layer': 2, 'n_head': 2, 'n_embd': 16, 'block_size': 16, 'vocab_size': 50, **config}))


def loss_inputs(n=300, d=16, v=257, dtype=torch.float32, seed=0):
    """(hidden, weight, targets) for the chunked loss: n rows of width d, a vocabulary of v; hidden and weight need
    gradients."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, d, generator=g, dtype=dtype, requires_grad=True)
    w = torch.randn(v, d, generator=g, dtype=dtype, requires_grad=True)
    t = torch.randint(0, v, (n,), generator=g)
    return h, w, t


def loss_budgets(n, v, dtype=torch.float32):
    """chunk_bytes at which chunked_cross_entropy takes n rows of a v-token vocabulary (and a width up to 16) in
    chunks of one row, of a few rows (a short last one), in one chunk (just below the one piece's bytes with
    gradients), and in one piece (the default, for inputs this small), as pytest params."""
    from training.chunked_loss import one_piece_bytes
    budgets = {'one row a chunk': 1, 'a few rows a chunk': 150 * v, 'one chunk': one_piece_bytes(n, v, dtype) - 1,
               'one piece': None}
    return [pytest.param(budget, id=name) for name, budget in budgets.items()]


def loss_and_grads(fn, h, w, t):
    """fn(h, w, t) and its gradients for h and w."""
    loss = fn(h, w, t)
    return (loss, *torch.autograd.grad(loss, (h, w)))


def loss_and_gradients(model, x, y, **forward_args):
    """(loss, [each parameter's gradient]) of one forward-backward from zero gradients."""
    model.zero_grad()
    _, loss = model(x, y, **forward_args)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


def tokens_with_documents(shape, seed, doc_token=3, every=5):
    """Random tokens of a 50-token vocabulary without doc_token, then doc_token at every `every`-th position from 2."""
    x = torch.randint(4, 50, shape, generator=torch.Generator().manual_seed(seed))
    x[..., 2::every] = doc_token
    return x


def softcap_inputs(dtype, n=70, d=16, v=97, seed=0):
    """(hidden, weight, targets) for the soft-capped loss: logits well into tanh's flat part, every 7th target -1."""
    g = torch.Generator().manual_seed(seed)
    h = (3 * torch.randn(n, d, generator=g, dtype=dtype)).requires_grad_()
    w = torch.randn(v, d, generator=g, dtype=dtype, requires_grad=True)
    t = torch.randint(0, v, (n,), generator=g)
    t[::7] = -1
    return h, w, t


def fixed_batch(model):
    """(x, y): 4 rows of random tokens of `model`'s vocabulary and block size, the same at every call."""
    generator = torch.Generator().manual_seed(1)
    return tuple(torch.randint(model.config.vocab_size, (4, model.config.block_size), generator=generator)
                 for _ in range(2))


def warm_up_lr(optimizer, peaks, step, steps):
    """Each group's learning rate at `step` of a linear warmup over `steps` to its peak (peaks: one a group)."""
    for group, lr in zip(optimizer.param_groups, peaks):
        group['lr'] = lr * (step + 1) / steps


def train_steps(model, optimizer, steps, first=0, scaler=None):
    """train.py's step (training.step.train_step: no accumulation, no clipping) on one fixed batch, steps first ..
    first+steps-1, each group's learning rate warming up linearly to the one it holds when called, through `scaler`
    if given. The losses."""
    batches = Prefetcher(itertools.repeat(fixed_batch(model)))
    peaks = [group['lr'] for group in optimizer.param_groups]
    losses = []
    for step in range(first, first + steps):
        warm_up_lr(optimizer, peaks, step, first + steps)
        loss, _ = train_step(model, optimizer, batches, 1, scaler=scaler)
        losses.append(loss.item())
    return losses


# every modern architecture option of GPTConfig (model.py) on, as train.py keys, but value_scale and no_attn_layer,
# which act on blocks without a value table: TINY_ARGS' 2 blocks both have one (tests/unit: their own); the window,
# in blocks of 2 positions, is shorter than TINY_ARGS' block_size (attention in blocks), grows to it from 2 over the
# first 6 iterations (2, 2, 4, 4, 6, 6, 8), and token 0 (a character dataset's newline) starts each document
MODERN_ARCH_ARGS = ['--pos_emb=rope', '--norm=rmsnorm', '--qk_norm=True', '--mlp=relu2', '--tie_weights=False',
                    '--zero_init_proj=True', '--logit_softcap=15.0', '--value_embeds=1', '--unet_skips=True',
                    '--x0_shortcut=True', '--embed_norm=True', '--norm_gain=False', '--value_residual=True',
                    '--rope_truncated=True', '--weight_init=pytorch', '--attn_window=8',
                    '--attn_window_block=2', '--attn_window_warmup_iters=6', '--attn_window_warmup_start=2',
                    '--doc_token=0']
# config/speedrun2026_gpt2_12gb.py (model_file='gpt2026.py') scaled down: the record's 11 layers 32 wide, rows of 32
# characters, a document at each newline (id 0)
RECORD_2026_ARGS = [str(ROOT / 'config' / 'speedrun2026_gpt2_12gb.py'), f'--dataset={DATASET}', '--n_head=2',
                    '--n_embd=32', '--block_size=32', '--batch_size=2', '--gradient_accumulation_steps=2',
                    '--eval_batch_size=2', '--eval_iters=2', '--doc_token=0', '--device=cpu', '--compile=False',
                    '--dtype=float32', '--log_interval=1']
# and the optimizer, schedule and batch order of the recipes: Muon (the record's: its momentum an average divided by
# norm + eps, q, k and v each on its own), its momentum warmup, per-group learning rates, wsd, train.bin read in order
MODERN_RECIPE_ARGS = [*MODERN_ARCH_ARGS, '--optim=muon', '--muon_momentum_warmup_iters=4', '--lr_schedule=wsd',
                      '--embedding_learning_rate=0.05', '--head_learning_rate=0.004', '--scalar_learning_rate=0.02',
                      '--muon_split_qkv=True', '--muon_momentum_form=ema_eps', '--batch_order=sequential']


# one micro-batch per process per iteration at world size 2, two in one process: the same global batch
PARALLEL_ARGS = [*TINY_ARGS, '--gradient_accumulation_steps=2', '--eval_interval=2']


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


# what torch.compile sets in the process that runs it (its cache folder, a pointer of that process): not the scripts'
# to inherit; read at torch's start, it would make every later run a real process instead of a forked child
SET_BY_COMPILE = ('TORCHINDUCTOR_', '_TORCHINDUCTOR_')
STARTED_WITH = frozenset(os.environ)


def one_thread_env(env=None):
    """The environment of a script the tests run: this one, less what a test's torch.compile has set here, one thread
    per process (the tests share two cores, and runs compared bit for bit use the same setting), and `env` over it."""
    own = {k: v for k, v in os.environ.items() if k in STARTED_WITH or not k.startswith(SET_BY_COMPILE)}
    return {**own, 'OMP_NUM_THREADS': '1', **(env or {})}


def run_script(script, *args, env=None, timeout=300, cwd=ROOT):
    """Run python script with args from cwd (ROOT: the repository), as a user would, in one_thread_env(env); the
    CompletedProcess, output captured."""
    return run_python(str(cwd / script), *args, env=env, timeout=timeout, cwd=cwd)


def run_python(*args, env=None, timeout=300, cwd=ROOT):
    """`python args` from cwd in one_thread_env(env), output captured: a child of the script server where it can be
    (script_server.py: without torch's import, seconds a run), a plain subprocess under TESTS_PLAIN_SUBPROCESS=1."""
    argv, env = [sys.executable, *map(str, args)], one_thread_env(env)
    if plain_subprocess():  # breakpoint() in the script: pdb on the terminal
        env = {'PYTHONBREAKPOINT': 'tty_breakpoint.set_trace', **env,
               'PYTHONPATH': os.pathsep.join(filter(None, [env.get('PYTHONPATH'), str(PATCHES)]))}
    else:
        served = running_script_server().run(argv, cwd, env, timeout)
        if served:
            return served
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


def plain_subprocess():
    """Whether TESTS_PLAIN_SUBPROCESS=1 is set: every script, torchrun and its workers a plain subprocess, slower
    but one that breakpoint() stops in, on the terminal (patches/tty_breakpoint.py)."""
    return os.environ.get(PLAIN_SUBPROCESS) == '1'


@functools.cache
def running_script_server():
    """The tests' one script server, started at its first use, in one_thread_env()."""
    server = script_server.ScriptServer(one_thread_env())
    atexit.register(server.close)
    return server


def train(data_dir, out_dir, *args, env=None):
    """train.py on the tiny model and the dataset in data_dir, writing to out_dir; args override."""
    return run_script('train.py', *TINY_ARGS, f'--data_dir={data_dir}', f'--out_dir={out_dir}', *args, env=env)


def load(out_dir):
    """The checkpoint train.py wrote to out_dir."""
    return torch.load(out_dir / 'ckpt.pt', weights_only=True)


def trace_card_preset(path):
    """estimate_memory.py's warm-started trace of a config/*_<N>gb.py preset at its card (N GiB): (the bytes of the card
    it may use, N GiB less gpu_headroom_gb; the trace). A function of this module so that a process pool can run
    it."""
    import estimate_memory
    from training.memory import estimate
    torch.set_num_threads(1)
    card_gb = int(re.search(r'_(\d+)gb\.py$', Path(path).name)[1])
    config = estimate_memory.load_config([str(path), f'--gpu_memory_gb={card_gb}'])
    return estimate.budget(config, card_gb * 2 ** 30), estimate.trace(config, warm_start=True)


def gpt2_estimator_config(batch_size, **overrides):
    """estimate_memory.py's config of GPT-2 124M from scratch, block 1024, bf16, one micro-step; a small evaluation
    batch keeps a trace with evaluation short."""
    import estimate_memory
    return {**estimate_memory.estimator_defaults(), 'init_from': 'scratch', 'dataset': 'openwebtext', 'n_layer': 12,
            'n_head': 12, 'n_embd': 768, 'block_size': 1024, 'bias': False, 'dropout': 0.0, 'batch_size': batch_size,
            'gradient_accumulation_steps': 1, 'eval_batch_size': 1, 'dtype': 'bfloat16', **overrides}


def check_only_the_naive_loss_holds_the_logits(batch_size, n_layer, loss_chunk_mib=1024):
    """GPT-2's width and vocabulary in n_layer blocks at batch_size x 1024 tokens, traced warm-started (the same peak in
    half the time) with nanoGPT's loss and with model.py's, its chunks within loss_chunk_mib (which must be less than
    the logits, else the chunked loss rightly runs them in one piece): the naive trace holds the (rows, 50304) bf16
    logits and more, the chunked one nothing of them beyond a chunk. Returns (naive, chunked, logits): the training
    phases' traces and the logits' allocation."""
    from training.memory import estimate
    config = gpt2_estimator_config(batch_size, n_layer=n_layer, loss_chunk_mib=loss_chunk_mib)
    naive, chunked = (estimate.trace(config, loss, evaluate=False, warm_start=True)['train']
                      for loss in ('naive', 'chunked'))
    rows, chunk_bytes = batch_size * 1024, loss_chunk_mib * 2 ** 20
    logits = {'shape': [rows, 50304], 'dtype': 'bfloat16', 'bytes': rows * 50304 * 2, 'category': 'loss_path'}
    assert chunk_bytes < logits['bytes'], 'a chunk budget that holds the logits runs them in one piece'
    assert logits in naive['largest_loss_path_allocations'] and logits in naive['largest_allocations']
    # the loss path holds nothing larger than a chunk's budget but the head's gradient, so nothing of the
    # (rows, 50304) logits beyond a chunk
    head = [50304, 768]
    assert max(a['bytes'] for a in chunked['largest_loss_path_allocations'] if a['shape'] != head) <= chunk_bytes
    assert all(a['bytes'] <= chunk_bytes for a in chunked['largest_allocations'] if a['shape'] != head)
    # its gradients; under bf16 autocast the bf16 copy of the weight, the rows' bf16 (rows, d) operands; one chunk's
    # fp32 logits buffer, a bf16 chunk beside it and the bf16 product on its way into the fp32 weight gradient, all
    # within the chunk's budget
    gradients = (rows + 50304) * 768 * 4
    beyond_gradients = 50304 * 768 * 2 + rows * 768 * 2 + chunk_bytes
    assert gradients < chunked['breakdown']['loss_path'] < gradients + beyond_gradients
    # the naive loss's bf16 logits, their fp32 log-softmax and its fp32 gradient: 5 times the bf16 logits' bytes,
    # where the chunked loss takes its budget at most
    assert naive['peak_bytes'] > chunked['peak_bytes'] - chunk_bytes + 5 * logits['bytes']
    return naive, chunked, logits


def assert_same_losses(stdout, reference, kind, iterations):
    """The logged losses of `kind` (see logged_losses) at `iterations` in stdout are those of `reference`, within a
    unit of the log's last digit: two sums of the same gradients in other orders differ by far less, but may fall on
    either side of a rounding boundary, and 3.3052 - 3.3051 is 1.0000000000000009e-4 in floats."""
    losses, expected = logged_losses(stdout, kind), logged_losses(reference, kind)
    assert sorted(losses) == list(iterations)
    assert [losses[i] for i in iterations] == [pytest.approx(expected[i], abs=1.5e-4) for i in iterations]


def torchrun(*args, processes=2, env=None, timeout=300):
    """train.py with args under torchrun, `processes` processes on this machine, as run_script runs one."""
    return run_torchrun('--standalone', f'--nproc_per_node={processes}', 'train.py', *args, env=env, timeout=timeout)


def run_torchrun(*words, env=None, timeout=300, cwd=ROOT):
    """`torchrun words` (its options, a script, the script's args) from cwd, as run_script runs a script. Each worker
    that torchrun would start as `python -u script args` is a child of the script server too where it can be
    (script_server.torchrun_worker), torchrun's own under TESTS_PLAIN_SUBPROCESS=1."""
    if plain_subprocess():
        return run_python('-m', 'torch.distributed.run', *words, cwd=cwd, timeout=timeout, env=env)
    script = next(i for i, word in enumerate(words) if str(word).endswith('.py'))
    worker = ['--no-python', sys.executable, '-S', script_server.__file__, 'worker']
    return run_python('-m', 'torch.distributed.run', *words[:script], *worker, *words[script:], cwd=cwd,
                      timeout=timeout, env={**(env or {}), script_server.ADDRESS: running_script_server().address})


def patched_env(*patches, **settings):
    """Environment for a subprocess (or every process torchrun starts) that imports the modules `patches` of
    tests/patches/ first (patches/sitecustomize.py), `settings` being what they read from the environment."""
    return {'PYTHONPATH': str(PATCHES), 'TESTS_PATCHES': ','.join(patches), **settings}


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


EOT = 50256  # GPT-2's <|endoftext|>
GPT2_FILES = ['https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/vocab.bpe',
              'https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/encoder.json']
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def tiny_encoding(special_id=EOT, vocab_size=None):
    """Byte-level BPE without a download: the 256 bytes, a few merges (' t', ' the', ...) and <|endoftext|> (50256
    as in gpt2). vocab_size: as many tokens as that, made of byte pairs, so a GPT-2-sized model's samples decode."""
    ranks = {bytes([b]): b for b in range(256)}
    for merge in [b'th', b'he', b'the', b'in', b'er', b' s', b' t', b' the']:
        ranks[merge] = len(ranks)
    pairs = (bytes([a, b]) for a in range(256) for b in range(256))
    while vocab_size is not None and len(ranks) < min(vocab_size, special_id):
        ranks.setdefault(next(pairs), len(ranks))
    return tiktoken.Encoding(name='tiny', pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                             special_tokens={'<|endoftext|>': special_id})


def gpt2_cached():
    """Whether tiktoken's gpt2 files are cached here (offline: TIKTOKEN_CACHE_DIR pointing at them)."""
    cache = (os.environ.get('TIKTOKEN_CACHE_DIR') or os.environ.get('DATA_GYM_CACHE_DIR')
             or os.path.join(tempfile.gettempdir(), 'data-gym-cache'))
    return all(os.path.exists(os.path.join(cache, hashlib.sha1(url.encode()).hexdigest())) for url in GPT2_FILES)


# as in HellaSwag's files, with the fields the scorer ignores
HELLASWAG_EXAMPLES = [
    dict(ind=0, activity_label='Cats', ctx='The cat sat on the', endings=['mat.', 'moon', 'sofa and slept', 'a'],
         label=0, split='val'),
    dict(ind=1, activity_label='Cooking', ctx='She cracks two eggs into the bowl and then she',
         endings=['whisks them.', 'sings', 'puts the bowl in the oven with the shells', 'x'], label=2, split='val'),
    dict(ind=2, activity_label='Roof', ctx='A man is sitting on a roof. he',
         endings=['is using wrap to wrap', 'is ripping tiles off.', 'holds a cube.', 'starts pulling up'], label=3,
         split='val'),
    dict(ind=3, activity_label='Tea', ctx='Tea', endings=['is hot.', 'the', 'in the pot', 'er'], label=1, split='val'),
    dict(ind=4, activity_label='Run', ctx='They run along the beach until the sun', endings=['sets.', 'is', 'the', ''],
         label=0, split='val'),
    dict(ind=5, activity_label='Dog', ctx='The dog', endings=['barks at the', 'the the', 'sleeps.', 'in'], label=2,
         split='val'),
    dict(ind=6, activity_label='Rain', ctx='It rained all day, so they stayed inside and',
         endings=['played cards', 'sunbathed', 'the', 'slept in their beds'], label=0, split='val'),
]


def write_jsonl(path, examples):
    path.write_text(''.join(json.dumps(example) + '\n' for example in examples), encoding='utf-8')
    return path


# a small GPT as after training, its checkpoint, and the check that an exported model computes what it does
HF_ARGS = dict(n_layer=2, n_head=2, n_embd=32, block_size=16, bias=True, vocab_size=40, dropout=0.0)


def trained_like_gpt(seed, tied=True, **args):
    """A GPT whose weights are random but not init-shaped (biases and LayerNorms nonzero), as after training; args:
    GPTConfig's, over HF_ARGS' (tie_weights over tied)."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(**{**HF_ARGS, 'tie_weights': tied, **args}))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model.eval()

def write_checkpoint(out_dir, model, prefix='', dtype=torch.float32, data_dir=None):
    os.makedirs(out_dir, exist_ok=True)
    state = {prefix + k: v.to(dtype) for k, v in model.state_dict().items()}
    config = {'data_dir': str(data_dir), 'dataset': 'tiny_char'} if data_dir else {}
    torch.save({'model': state, 'model_args': dict(model.config.__dict__), 'config': config},
               os.path.join(out_dir, 'ckpt.pt'))

def assert_same_model(ours, theirs):
    """Every position's logits (ours: the last position of each prefix) to 1e-5 in fp32, and greedy tokens equal."""
    torch.manual_seed(1)
    idx = torch.randint(0, ours.config.vocab_size, (2, ours.config.block_size))
    with torch.no_grad():
        their_logits = theirs(idx).logits
        our_logits = torch.cat([ours(idx[:, :t])[0] for t in range(1, idx.shape[1] + 1)], dim=1)
        torch.testing.assert_close(their_logits, our_logits, atol=1e-5, rtol=0)
        prompt = idx[:1, :4]
        greedy = theirs.generate(prompt, max_new_tokens=12, do_sample=False)
        assert torch.equal(greedy, ours.generate(prompt, 12, top_k=1))
