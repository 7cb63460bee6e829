"""Every command in the ```sh blocks of README.md, then of docs/*.md, runs as written, in the pages' order, in one copy
of the repository, as a reader would run them: with tiny-model overrides appended where it would train for long, local
data written here, and the downloads (Tiny Shakespeare, GPT-2's BPE and weights, HellaSwag) replaced by local
stand-ins (patches/offline_gpt2.py), since no test can reach the network."""
import itertools
import json
import re
import shlex
import shutil
import subprocess

import numpy as np
import pytest

from helpers import ROOT, TEXT, patched_env, run_script, run_torchrun

# the commands run in the pages' order, each on what those before it wrote: under pytest-xdist, all in one worker
# (--dist loadgroup)
pytestmark = pytest.mark.xdist_group('readme')


# what a command that would run long or reach the network gets appended, by its script
TINY_MODEL = ['--n_layer=2', '--n_head=2', '--n_embd=32', '--block_size=16', '--batch_size=2', '--max_iters=2',
              '--eval_interval=2', '--eval_iters=1', '--log_interval=1', '--device=cpu', '--compile=False',
              '--dtype=float32', '--always_save_checkpoint=True']  # 2 iterations may not improve val
APPENDED = {
    'prepare/shakespeare_char.py': ['--input', 'input.txt'],
    'prepare/shakespeare.py': ['--input', 'input.txt'],
    'train.py': TINY_MODEL,
    'sample.py': ['--num_samples=1', '--max_new_tokens=8', '--device=cpu', '--dtype=float32'],
    'bench.py': ['--n_layer=1', '--n_head=2', '--n_embd=32', '--block_size=16', '--batch_size=2', '--num_steps=2',
                 '--burnin_steps=1', '--device=cpu', '--compile=False', '--dtype=float32', '--loss_rows=256',
                 '--loss_runs=1'],
    'bench_optim.py': ['--n_layer=1', '--n_head=2', '--n_embd=32', '--block_size=16', '--batch_size=4',
                       '--max_iters=4', '--eval_interval=2', '--eval_iters=2', '--lr_decay_iters=4',
                       '--warmup_iters=1'],
    'hellaswag.py': ['--device=cpu', '--dtype=float32', '--max_examples=3'],
    'estimate_memory.py': [],
    'export_hf.py': [],
}


# installs need the network (the tests run in the environment they set up), the tests cannot run themselves, and
# lm-evaluation-harness is not a dependency
SKIPPED = ('pip ', 'python -m pytest ', 'lm_eval ')
CUDA_ONLY = ('--find_batch_size=True',)  # tries micro-batches until the GPU runs out of memory: refused on a CPU
RECORD_2026_PRESET = 'speedrun2026_gpt2_12gb.py'  # gpt2026.py's model, which has the record's 11 layers, no fewer


def readme_commands():
    """The commands of the ```sh blocks of README.md and docs/*.md, a line each, comments dropped."""
    text = ''.join(page.read_text() for page in [ROOT / 'README.md', *sorted((ROOT / 'docs').glob('*.md'))])
    lines = [line for block in re.findall(r'```sh\n(.*?)```', text, re.S) for line in block.splitlines()]
    return [line.split('  #')[0].strip() for line in lines if line.strip() and not line.startswith('#')]


def with_overrides(command):
    """The commands of `command` (joined by &&), each a list of words, with each script's overrides appended and
    installs dropped."""
    parts = []
    for part in command.split(' && '):
        if part.startswith(SKIPPED):
            continue
        words = shlex.split(part)
        script = next(word for word in words if word.endswith('.py'))
        appended = APPENDED[script]
        if any(flag in part for flag in CUDA_ONLY):  # on the GPU, in its default dtype
            appended = [word for word in appended if word not in ('--device=cpu', '--dtype=float32')]
        if RECORD_2026_PRESET in part:
            appended = ['--n_layer=11' if word.startswith('--n_layer=') else word for word in appended]
        parts.append([*words, *appended])
    return parts


@pytest.fixture(scope='module')
def repository(tmp_path_factory):
    """A copy of the repository's tracked files with the data the commands expect: Tiny Shakespeare's input.txt
    stand-in, a small GPT-2-token OpenWebText, and HellaSwag examples."""
    copy = tmp_path_factory.mktemp('repository')
    tracked = subprocess.run(['git', 'ls-files'], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    for name in tracked.split():
        if (ROOT / name).is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / name, copy / name)
    (copy / 'input.txt').write_text(TEXT)
    (copy / 'data' / 'openwebtext').mkdir(parents=True)
    ids = np.random.default_rng(0).integers(50257, size=4096, dtype=np.uint16)
    for split in ('train', 'val'):
        ids.tofile(copy / 'data' / 'openwebtext' / f'{split}.bin')
    (copy / 'data' / 'hellaswag').mkdir()
    example = dict(ctx='The cat sat on the', endings=['mat.', 'moon', 'sofa', 'a'], label=0)
    (copy / 'data' / 'hellaswag' / 'hellaswag_val.jsonl').write_text(json.dumps(example) + '\n')
    # a user's own Hugging Face GPT-2 folder (docs/export.md), of the stand-in's tiny shape
    import transformers  # here, not at collection: seconds to import
    transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32)).save_pretrained(
        copy / 'hf-my-gpt2')
    return copy


@pytest.mark.parametrize('command', [pytest.param(command, marks=pytest.mark.cuda if any(
    flag in command for flag in CUDA_ONLY) else ()) for command in readme_commands()])
def test_readme_command_runs_as_written(repository, command):
    if not with_overrides(command):
        pytest.skip(f'{command}: an install, or this test suite')
    # GPT-2's BPE and weights in every process: patches/offline_gpt2.py; nanoGPT's train_gpt2.py logs to wandb
    env = {**patched_env('offline_gpt2'), 'WANDB_MODE': 'disabled'}
    for words in with_overrides(command):
        # through helpers, as the tests run scripts, with the variables a command sets (VAR=value python ...)
        variables = dict(word.split('=', 1) for word in itertools.takewhile(re.compile('[A-Z_]+=').match, words))
        program, *args = words[len(variables):]
        run = {'python': run_script, 'torchrun': run_torchrun}[program]
        result = run(*args, cwd=repository, env={**env, **variables}, timeout=600)
        assert result.returncode == 0, f'{command}\n{result.stderr[-3000:]}'
