"""What the scripts write where a user runs them, at their defaults, is git-ignored: `git status` after the README's
commands shows the user's own changes only."""
import shutil
import subprocess

import pytest

from training import configurator
from helpers import ROOT

pytestmark = pytest.mark.skipif(shutil.which('git') is None or not (ROOT / '.git').exists(),
                                reason='needs git and a git checkout')


def ignored(path):
    return subprocess.run(['git', 'check-ignore', '--no-index', '-q', path], cwd=ROOT).returncode == 0


def test_the_scripts_outputs_are_ignored():
    card_report = configurator.read_keys(ROOT / 'bench.py')['card_report'].default
    out_dir = configurator.train_keys()['out_dir'].default
    written = [f'{card_report}.md', f'{card_report}.json', f'{out_dir}/ckpt.pt', 'out-shakespeare-char/ckpt.pt',
               'hf-shakespeare-char/config.json', 'data/shakespeare_char/train.bin', 'wandb/latest-run']
    assert [path for path in written if not ignored(path)] == []


def test_what_the_project_ships_is_not_ignored():
    shipped = ['data/README.md', 'docs/cards/README.md', 'docs/cards/rtx-3060-12gb.md', 'config/train_gpt2.py']
    assert [path for path in shipped if ignored(path)] == []
