"""bench.py --mode=card: one command that proves this project's presets on a GPU and checks what only a GPU can show,
keeping each figure as soon as it is measured (card.md and card.json rewritten atomically after each part:
training/card_report.py), and measuring in a later run only what its report still lacks.

Its parts, each in child processes of its own (this process allocates nothing on the GPU, so each child has its memory
as a train.py run would), in this order:
1. the checks (training/card_checks.py's CHECKS, each a result of its own), on the speedrun preset's model;
2. each card preset (config/*_<N>gb.py): train.py itself, held to the card it names (training/card_train.py); the
   speedrun preset first, then the others that train from scratch, then the finetunes, each group the 12 GB ones
   first, then from the smallest model up (card_train.preset_paths);
3. nanoGPT's path (training/card_measure.py): config/train_gpt2.py's model with our loss and with the full logits;
4. the profile (training/card_profile.py): the speedrun preset's step and nanoGPT's compiled step.

Coverage accumulates. Each result keeps a fingerprint of the files that made it: the training code (train.py,
model.py, gpt2026.py and training/ but for the card's own modules), the card
module that measured it (PART_FILES) and the configs it ran. Given the report of an earlier run on the same GPU and
torch (card_report), the card measures only the parts that it lacks (a stale part whose attempt failed lacks its
result), then those a time limit stopped, then the stale ones (whose fingerprint changed: kept, and marked so, until
measured again). A preset that this machine cannot run (train.py's own checks: torchao for 8-bit AdamW, an Ampere GPU
for bf16 weights) is skipped with that line and tried again in a later run. Each part is stopped at
card_preset_seconds, and the card at card_seconds: the part then running is stopped (its row says so, and a later run
retries it), and the parts not started are left to a later run.

On a CPU the same code runs at a CPU's scale (card_measure.TINY, bf16 autocast as on a GPU, GPT-2's vocabulary for
nanoGPT's path; the presets' train.py eager, without a cap): the tests keep it working."""
import glob
import hashlib
import json
import os
import sys
import tempfile
import time

import torch

from training import card_checks
from training.card_measure import NANOGPT_CONFIG, ROOT, SPEEDRUN, run_child
from training.card_report import check_line, nanogpt_lines, preset_line, profile_lines, read_report, write_report
from training.card_train import preset_paths, run_preset
from training.errors import ConfigError

# the training code every figure depends on, with training/'s modules but the card's own (card*.py)
CODE = ('train.py', 'model.py', 'gpt2026.py')
# each kind of part's own files beyond the training code (a preset part also its preset's file)
PART_FILES = {
    'checks': ('training/card_checks.py', 'training/card_measure.py', f'config/{SPEEDRUN}'),
    'preset': ('training/card_train.py', 'training/card_measure.py'),
    'nanogpt_path': ('training/card_measure.py', f'config/{NANOGPT_CONFIG}'),
    'profile': ('training/card_profile.py', 'training/card_measure.py', f'config/{SPEEDRUN}',
                f'config/{NANOGPT_CONFIG}'),
}
NEVER, STOPPED, STALE = 0, 1, 2 # a part to measure, in this order: never measured, stopped by a time limit, stale


def selected(paths, names):
    """The presets of `paths` that `names` picks (file names, with or without .py; none: all), in their order;
    ConfigError naming card_presets for a name that is no card preset."""
    known = {os.path.basename(path): path for path in paths}
    wanted = [name if name.endswith('.py') else f'{name}.py' for name in names]
    unknown = [name for name in wanted if name not in known]
    if unknown:
        raise ConfigError(f"card_presets: {', '.join(unknown)} is no card preset: use some of {', '.join(known)}, "
                          f"comma-separated, or '' for all")
    return [path for name, path in known.items() if not wanted or name in wanted]


def digest(paths, seed=''):
    """A short hash of `seed` and the names and contents of `paths` (relative to the repository or absolute)."""
    h = hashlib.sha256(seed.encode())
    for path in paths:
        with open(os.path.join(ROOT, path), 'rb') as f:
            h.update(os.path.basename(path).encode() + b'\0' + f.read())
    return h.hexdigest()[:16]


def code_digest():
    """The digest of the training code (CODE and training/'s modules but the card's own)."""
    modules = sorted(os.path.relpath(path, ROOT) for path in glob.glob(os.path.join(ROOT, 'training', '**', '*.py'),
                                                                      recursive=True)
                     if not os.path.basename(path).startswith('card'))
    return digest([*CODE, *modules])


def fingerprint(code, kind, preset=None):
    """The fingerprint of a part of `kind`: the training code's digest, its PART_FILES and its preset's file."""
    return digest([*PART_FILES[kind], *([os.path.abspath(preset)] if preset else [])], seed=code)


def state(entry, current):
    """Where a part's result stands: NEVER measured, STOPPED by a time limit, STALE (made by other code or another
    preset file; an entry of an earlier card has no fingerprint), or None: measured, and current. Marks it stale or
    not, for the report. A stale part whose attempt failed (an error other than a preset's out-of-memory FAIL, which
    is a result) has nothing to keep: NEVER, so that the fix of what failed is tried first. Current, it stands: the
    same code would fail again."""
    if entry is None:
        return NEVER
    if 'stopped' in entry:
        return STOPPED
    entry.pop('stale', None)
    if entry.get('fingerprint') != current:
        entry['stale'] = True
        return NEVER if 'error' in entry and entry.get('fits') is not False else STALE
    return None


def kept(old, new):
    """The entry to keep: the new one, but an earlier result (stale) where the new attempt measured nothing: stopped
    by a limit, or skipped for what this machine lacks."""
    if old is not None and 'fingerprint' in old and ('stopped' in new or 'skipped' in new):
        return dict(old, last_attempt=new.get('stopped') or f"skipped: {new['skipped']}")
    return new


def measured(job, limit, progress):
    """card_measure's figures for `job`, run in a child process stopped after limit = (seconds, the key that set
    them): what it measured, with 'stopped' (the phase it was in) or 'error' (its last line) where it did not finish,
    and 'phase', the phase it ended in."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, 'result.json')
        status, last = run_child([sys.executable, '-m', 'training.card_child', json.dumps(job), path], limit[0],
                                 progress)
        row = {}
        if os.path.exists(path):
            with open(path, encoding='utf-8') as f:
                row = json.load(f)
    row.setdefault('phase', 'starting')
    if status is None:
        row['stopped'] = f"stopped after {limit[0]:.0f} s ({limit[1]}) while {row['phase']}"
    elif row['phase'] != 'done' and 'error' not in row:
        row['error'] = last or f'exit status {status}'
    return row


def continued(previous, facts, tiny, report, progress):
    """The result this run adds to: a new one, or the report of an earlier run on this GPU and torch (ConfigError for
    another's)."""
    result = dict(device=facts['device'], torch=torch.__version__, scaled_down=tiny, checks={}, presets=[],
                  nanogpt_path=None, profile=None, runs=[])
    if previous is None:
        return result
    if (previous['device'], previous['torch'].split('+')[0]) != (facts['device'], torch.__version__.split('+')[0]):
        raise ConfigError(f"card_report={report} is the report of {previous['device']} with torch "
                          f"{previous['torch']}, not of this {facts['device']} with torch {torch.__version__}: pass "
                          f"another --card_report (one report per GPU and torch version)")
    return dict(result, checks=previous.get('checks', {}), nanogpt_path=previous.get('nanogpt_path'),
                profile=previous.get('profile'), runs=previous.get('runs', []), presets=previous.get('presets', []))


def plan(result, paths, code):
    """The parts to measure now, in order: (state, position, kind, what: the checks' names or a preset's path)."""
    current, due = fingerprint(code, 'checks'), {}
    for name, _ in card_checks.CHECKS: # the checks in a part for each state: a new check does not wait for stale ones
        check_state = state(result['checks'].get(name), current)
        if check_state is not None:
            due.setdefault(check_state, []).append(name)
    parts = [(check_state, 0, 'checks', names) for check_state, names in due.items()]
    rows = {row['preset']: row for row in result['presets']}
    for position, path in enumerate(paths, 1):
        row = rows.get(os.path.basename(path))
        preset_state = NEVER if row is not None and 'skipped' in row else state(row, fingerprint(code, 'preset', path))
        if preset_state is not None:
            parts.append((preset_state, position, 'preset', path))
    for position, kind in enumerate(('nanogpt_path', 'profile'), len(paths) + 1):
        part_state = state(result[kind], fingerprint(code, kind))
        if part_state is not None:
            parts.append((part_state, position, kind, None))
    return sorted(parts)


def label(kind, what):
    """A part's name in the run's record and its lines."""
    if kind == 'checks':
        return f"checks: {', '.join(what)}"
    if kind == 'preset':
        return os.path.basename(what)
    return "nanoGPT's path" if kind == 'nanogpt_path' else 'profile'


def measure_checks(result, names, job, limit, code, progress):
    """The checks of `names` in one child, each kept with its fingerprint; the one a limit stopped says so."""
    row = measured(dict(job, kind='checks', name='check', checks=names), limit, progress)
    current = fingerprint(code, 'checks')
    for name in names:
        if name in row.get('checks', {}):
            result['checks'][name] = dict(row['checks'][name], fingerprint=current)
        elif name == row['phase'] and ('stopped' in row or 'error' in row): # the check it ended in
            new = {'stopped': row['stopped']} if 'stopped' in row else {'error': row['error'], 'fingerprint': current}
            result['checks'][name] = kept(result['checks'].get(name), new)
    result['checks'] = {name: result['checks'][name] for name, _ in card_checks.CHECKS if name in result['checks']}
    for name in names:
        if name in result['checks']:
            progress(check_line(name, result['checks'][name]))


def measure_preset(result, path, job, limit, facts, code, progress):
    """train.py's runs of the preset at `path` (card_train.run_preset), its row kept in the card's order."""
    row = run_preset(path, job['device'], job['device_type'], job['steps'], limit, facts, progress)
    if 'stopped' not in row and 'skipped' not in row:
        row['fingerprint'] = fingerprint(code, 'preset', path)
    rows = {row['preset']: row for row in result['presets']}
    rows[row['preset']] = kept(rows.get(row['preset']), row)
    result['presets'] = [rows[name] for name in result['card_presets'] if name in rows]
    progress(preset_line(row['preset'], rows[row['preset']]))


def measure_part(result, kind, job, limit, code, progress):
    """nanoGPT's path or the profile, in a child of its own."""
    row = measured(dict(job, kind=kind, name=label(kind, None)), limit, progress)
    del row['phase']
    if 'stopped' not in row:
        row['fingerprint'] = fingerprint(code, kind)
    result[kind] = kept(result[kind], row)
    progress((nanogpt_lines if kind == 'nanogpt_path' else profile_lines)(result[kind])[0])


def run(device, device_type, names=(), steps=3, seconds=1800, part_seconds=600, report='card', progress=print,
        config_dir=os.path.join(ROOT, 'config')):
    """Everything the card mode measures, added to the report at `report` (its path without the extension) and
    written there after each part: the parts its report lacks or holds stale (see the module's docstring), the
    presets among them those of `names` (or all), within part_seconds each and `seconds` in all. The result."""
    start = time.perf_counter()
    tiny = device_type != 'cuda'
    all_paths = preset_paths(config_dir)
    paths = selected(all_paths, names)
    job = dict(device=device, device_type=device_type, tiny=tiny, steps=steps)
    facts = measured(dict(job, kind='device', name='device', paths=[os.path.abspath(p) for p in paths]),
                     (min(part_seconds, seconds), 'card_preset_seconds'), progress)
    if 'device' not in facts:
        raise ConfigError(f"the card's device check did not end: {facts.get('stopped') or facts.get('error')}")
    result = continued(read_report(report), facts, tiny, report, progress)
    result['card_presets'] = [os.path.basename(path) for path in all_paths]
    code = code_digest()
    parts = plan(result, paths, code)
    progress(f"card: {facts['device']}, torch {torch.__version__}: "
             + (', '.join(label(kind, what) for _, _, kind, what in parts) or 'nothing') + ' to measure')
    done = []
    for _, _, kind, what in parts:
        left = seconds - (time.perf_counter() - start)
        if left <= 0:
            break
        limit = (part_seconds, 'card_preset_seconds') if part_seconds <= left else (left, 'card_seconds')
        progress(f'card: {label(kind, what)}')
        if kind == 'checks':
            measure_checks(result, what, dict(job, path=os.path.abspath(os.path.join(config_dir, SPEEDRUN))), limit,
                           code, progress)
        elif kind == 'preset':
            measure_preset(result, what, job, limit, facts, code, progress)
        else:
            measure_part(result, kind, job, limit, code, progress)
        done.append(label(kind, what))
        write_report(result, report)
    result['runs'].append(dict(seconds=time.perf_counter() - start, card_seconds=seconds, measured=done,
                               left=[label(kind, what) for _, _, kind, what in parts[len(done):]]))
    write_report(result, report)
    return result
