"""bench.py --mode=card's report: card.json (what training/card.py measured, part by part, each with the fingerprint
of what made it) read back for a later run and written atomically, and card.md, its Markdown; and the table of
docs/cards/README.md, each card preset against each committed report:

$ python -m training.card_report docs/cards      (the table, from the reports there)"""
import glob
import json
import os
import sys

from training.card_checks import CHECK_STEPS, CHECKS
from training.card_measure import NANOGPT_CONFIG, SPEEDRUN, write_atomically
from training.card_profile import CATEGORIES, OTHER
from training.errors import ConfigError, first_line
from training.paths import ROOT

GIB = 2 ** 30
STALE = ' (stale: measured with another version of its code or preset)'
CHECK_NAMES = [name for name, _ in CHECKS]
CATEGORY_NAMES = {'attention': 'attention', 'matmul': 'matmuls', 'loss': 'the loss', 'optimizer': 'the optimizer',
                  OTHER: 'other'}


def read_report(path):
    """The card.json of `path` (the report's path without its extension), or None where there is none yet;
    ConfigError, one line, for a file that is not a card's report."""
    try:
        with open(f'{path}.json', encoding='utf-8') as f:
            result = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise ConfigError(f'card_report={path}: {path}.json cannot be read as a card report ({first_line(e)}): name '
                          f'another path') from None
    if not isinstance(result, dict) or not {'device', 'torch'} <= set(result):
        raise ConfigError(f'card_report={path}: {path}.json is not a card report (no device and torch): name another '
                          f'path')
    return result


def write_report(result, path):
    """`path`.md and `path`.json, each written atomically; the two paths."""
    write_atomically(f'{path}.md', markdown(result))
    write_atomically(f'{path}.json', json.dumps(result, indent=1))
    return f'{path}.md', f'{path}.json'


def gib(n):
    return 'n/a' if n is None else f'{n / GIB:.2f}'


def stale(entry):
    return STALE if entry.get('stale') else ''


def check_line(name, check):
    """A check's row of the report: its verdict, the loss against the reference's, and the loss's and the furthest
    gradient's differences beside the measured noise (all relative)."""
    if not {'skipped', 'error', 'stopped'}.isdisjoint(check):
        why = next(f'{key}: {check[key]}' if key != 'stopped' else check[key]
                   for key in ('skipped', 'error', 'stopped') if key in check)
        return f'| {name} | {why}{stale(check)} | | | | |'
    steps = f"; losses of {CHECK_STEPS} steps {check['step_difference']:.1e} (noise " \
            f"{check['step_noise']:.1e})" if 'step_difference' in check else ''
    return (f"| {name} | {'pass' if check['passed'] else 'FAIL'}{stale(check)} | {check['loss']:.4f} "
            f"({check['reference_loss']:.4f}) | {check['loss_difference']:.1e} (noise {check['loss_noise']:.1e})"
            f"{steps} | {check['gradient_difference']:.1e} (noise {check['gradient_noise']:.1e}), "
            f"{check['gradient_parameter']} | {check['tolerance']}x noise |")


def verdict(row):
    """What a preset's row says of its card: fits (max reserved / cap), FAIL at its phase, or why neither."""
    if row is None:
        return 'not yet measured'
    if 'skipped' in row:
        return f"skipped: {row['skipped']}"
    if row.get('fits') is False:
        return f"FAIL at {row['phase_reached']}: {row['error']}"
    if 'stopped' in row:
        return row['stopped']
    if 'error' in row:
        return f"error at {row['phase_reached']}: {row['error']}"
    if row['fits']:
        return f"fits ({gib(row['max_reserved_bytes'])} / {gib(row['cap_bytes'])} GiB)"
    return 'ran every phase, no cap (a CPU)'


def preset_line(name, row):
    """A preset's row of the report; n/a where it was not measured."""
    row = row or {}

    def figure(key, form):
        return form.format(row[key]) if row.get(key) is not None else 'n/a'
    estimate = f"{gib(row['estimated_peak_bytes'])} ({gib(row['estimated_total_bytes'])})" \
        if 'estimated_peak_bytes' in row else 'n/a'
    mfu = f"{row['mfu'] * 100:.1f}%" if row.get('mfu') is not None else 'n/a'
    card = f"{row['card_gib']} GB" if 'card_gib' in row else ''
    return (f"| {name} | {card} | {gib(row.get('cap_bytes'))} | {estimate} | {gib(row.get('max_allocated_bytes'))} / "
            f"{gib(row.get('max_reserved_bytes'))} | {row.get('phase_reached', '')} "
            f"| {verdict(row or None)}{stale(row)} | {figure('compile_seconds', '{:.0f}')} "
            f"({figure('resume_compile_seconds', '{:.0f}')}) | {figure('step_seconds', '{:.3f}')} "
            f"| {figure('eval_micro_batch_seconds', '{:.4f}')} | {figure('tokens_per_s', '{:,.0f}')} | {mfu} "
            f"| {figure('train_hours', '{:.2f}')} + {figure('eval_hours', '{:.2f}')} |")


def outcome(row):
    """Why a part has no figures: stopped, skipped or its error."""
    return next((f"{'' if key == 'stopped' else key + ': '}{row[key]}" for key in ('stopped', 'skipped', 'error')
                 if key in row), 'not measured')


def nanogpt_lines(path):
    """nanoGPT's path: the step time ratios (ours / naive) and each side's peak memory, or why it has none."""
    if path is None:
        return [f"nanoGPT's path, config/{NANOGPT_CONFIG}: not yet measured.", '']
    head = f"nanoGPT's path, config/{NANOGPT_CONFIG}{stale(path)}: "
    if 'eager_ratio' not in path:
        return [head + outcome(path), '']
    compiled = f"{path['compiled_ratio']:.2f}x" if 'compiled_ratio' in path else outcome(path)
    return [head + f"micro-batch {path['micro_batch'][0]} x {path['micro_batch'][1]}, {path['n_layer']} layers, "
            f"n_embd {path['n_embd']}, vocabulary {path['vocab_size']:,}, {path['dtype']}: our loss's step time "
            f"against nanoGPT's full logits (ours / naive, median of alternating steps) eager "
            f"{path['eager_ratio']:.2f}x, compiled {compiled}; peak allocated GiB: ours "
            f"{gib(path['ours_peak_bytes'])}, naive {gib(path['naive_peak_bytes'])}.", '']


def profile_lines(profile):
    """Each profiled step: its time, the shares of its kernel (or operator) time, and its top kernels."""
    if profile is None:
        return ['Profile: not yet measured.', '']
    lines = [] if {'stopped', 'skipped', 'error'}.isdisjoint(profile) else [
        f'Profile{stale(profile)}: {outcome(profile)}', '']
    for label in (SPEEDRUN, NANOGPT_CONFIG):
        if label not in profile:
            continue
        step = profile[label]
        shares = ', '.join(f"{CATEGORY_NAMES[kind]} {step['shares'][kind]:.0%}" for kind in
                           [name for name, _ in CATEGORIES] + [OTHER])
        lines += [f"Profile{stale(profile)} of config/{label}'s step ({step['micro_steps']} micro-batches of "
                  f"{step['micro_batch'][0]} x {step['micro_batch'][1]}, {step['dtype']}, {step['optim']}, "
                  f"{'compiled' if step['compiled'] else 'eager'}): {step['seconds']:.3f} s, "
                  f"{step['profiled_seconds']:.3f} s of it profiled: {shares}.", '',
                  '| kernel or operator | part | ms | share |', '|---|---|---|---|']
        lines += [f"| `{top['name']}` | {CATEGORY_NAMES[top['category']]} | {top['seconds'] * 1000:.2f} "
                  f"| {top['share']:.1%} |" for top in step['top']]
        lines.append('')
    return lines


def speedrun_line(result):
    """The speedrun preset's hours to its tokens at the measured rate, where its row has them."""
    row = next((row for row in result['presets'] if row['preset'] == SPEEDRUN and 'hours' in row), None)
    if row is None:
        return []
    scale = ' (scaled down: not the real budget)' if result['scaled_down'] else ''
    return [f"{SPEEDRUN}{scale}: {row['tokens']:,} tokens in {row['hours']:.2f} h at the measured rate: "
            f"{row['train_hours']:.2f} h of training steps and {row['eval_hours']:.2f} h of loss evaluations "
            f"(HellaSwag's not included).", '']


def markdown(result):
    """The report of card.run()'s result, as Markdown: what is measured so far, and what is not yet."""
    runs = result.get('runs', [])
    lines = [f"# {result['device']}", '',
             f"torch {result['torch']}; {len(runs)} run{'s' if len(runs) != 1 else ''} of the card: " +
             '; '.join(f"{run['seconds']:.0f} s, {len(run['measured'])} parts measured" for run in runs) + '.', '']
    lines += ['| check | result | loss (reference) | loss difference | largest gradient difference, parameter '
              '| tolerance |', '|---|---|---|---|---|---|']
    names = [*CHECK_NAMES, *(name for name in result['checks'] if name not in CHECK_NAMES)]
    lines += [check_line(name, result['checks'][name]) if name in result['checks'] else
              f'| {name} | not yet measured | | | | |' for name in names]
    lines.append('')
    rows = {row['preset']: row for row in result['presets']}
    lines += ['| preset | card | cap GiB | estimate GiB: peak (total) | max allocated / reserved GiB | phase reached '
              '| result | compile s (resumed) | s/step | s/eval micro-batch | tokens/s | MFU | hours: train + eval |',
              '|---|---|---|---|---|---|---|---|---|---|---|---|---|']
    lines += [preset_line(name, rows.get(name)) for name in result.get('card_presets', rows)]
    lines.append('')
    lines += speedrun_line(result) + nanogpt_lines(result.get('nanogpt_path')) + profile_lines(result.get('profile'))
    return '\n'.join(lines).rstrip() + '\n'


def coverage_cell(row):
    """A preset in the table of docs/cards: fits (max reserved / cap), FAIL at its phase, error at its phase, or not
    yet measured (no row, no cap, skipped or stopped)."""
    if row is None or 'cap_bytes' not in row:
        return 'not yet measured'
    if row.get('fits') is False:
        return f"FAIL at {row['phase_reached']}"
    if row.get('fits'):
        return f"fits ({gib(row['max_reserved_bytes'])} / {gib(row['cap_bytes'])} GiB)"
    if 'error' in row:
        return f"error at {row['phase_reached']}"
    return 'not yet measured'


def coverage(names, reports):
    """The table of docs/cards/README.md: a row for each card preset of `names`, a column for each report of
    `reports` ({the report's file name without its extension: its result})."""
    lines = ['| preset | ' + ' | '.join(f"[{result['device']}, torch {result['torch'].split('+')[0]}]({name}.md)"
                                         for name, result in reports.items()) + ' |',
             '|---|' + '---|' * len(reports)]
    for preset in names:
        cells = [coverage_cell(next((row for row in result['presets'] if row['preset'] == preset), None))
                 for result in reports.values()]
        lines.append(f'| {preset} | ' + ' | '.join(cells) + ' |')
    return '\n'.join(lines) + '\n'


def committed_reports(folder):
    """{file name without extension: result} of the GPU reports in `folder` (scaled-down CPU runs left out)."""
    reports = {}
    for path in sorted(glob.glob(os.path.join(folder, '*.json'))):
        result = read_report(path[:-len('.json')])
        if not result.get('scaled_down'):
            reports[os.path.basename(path)[:-len('.json')]] = result
    return reports


if __name__ == '__main__':
    from training.card_train import preset_paths
    names = [os.path.basename(path) for path in preset_paths(os.path.join(ROOT, 'config'))]
    print(coverage(names, committed_reports(sys.argv[1])), end='')
