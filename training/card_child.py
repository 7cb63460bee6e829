"""The child process of bench.py --mode=card that measures one part (training/card.py runs it, card_measure.run_child):
it prints the phase it enters and, as each phase starts, writes what it has measured so far to its result file
(atomically), so that a child stopped at its limit leaves its phase and its figures.

$ python -m training.card_child '<job as JSON>' <result.json>   (job: its kind, 'device', 'checks', 'nanogpt_path'
                                                                   or 'profile', and their arguments)"""
import json
import sys

import torch

from training.card_measure import measure_checks, measure_device, measure_nanogpt_path, write_atomically
from training.card_profile import measure_profile
from training.errors import ConfigError, first_line


def measure(job, report):
    """The figures of `job`, by its kind."""
    device, device_type, tiny = job['device'], job['device_type'], job['tiny']
    if job['kind'] == 'device':
        return measure_device(job['paths'], device, device_type, tiny)
    if job['kind'] == 'checks':
        return measure_checks(job['path'], job['checks'], device, device_type, tiny, report)
    if job['kind'] == 'profile':
        return measure_profile(device, device_type, tiny, report)
    return measure_nanogpt_path(device, device_type, job['steps'], tiny, report)


def main(job, path):
    """Runs `job` and writes its result to `path`: its figures and phase (as it goes), then 'done', or 'error' (the
    error's line) or 'skipped' (a lever this machine lacks, or its memory)."""
    row = {} # the figures of the last phase reported, kept where a later phase fails

    def report(phase, figures):
        row.update(figures)
        print(f"{job['name']}: {phase}", flush=True)
        write_atomically(path, json.dumps(dict(row, phase=phase)))

    try:
        row.update(measure(job, report))
    except ConfigError as e: # a lever this machine lacks
        row['skipped'] = str(e)
    except torch.OutOfMemoryError:
        row['skipped'] = 'out of memory'
    except Exception as e: # the card goes on with its next part; the row says what failed
        row['error'] = f'{type(e).__name__}: {first_line(e)}'
    write_atomically(path, json.dumps(dict(row, phase='done')))


if __name__ == '__main__':
    main(json.loads(sys.argv[1]), sys.argv[2])
