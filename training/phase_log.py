"""train.py's phase_log: a JSON line as each phase of the run begins ('build' or 'resume', then 'evaluation',
'checkpoint' and 'step' with their iteration, and 'done'), with the seconds since the log was opened and, on CUDA, the
peak memory so far (max allocated and reserved; train.py resets the peaks before its loop). A phase lasts until the
next line, so a run's step, evaluation and checkpoint times are differences of its lines, and a run that stopped was
in the phase of its last line. bench.py --mode=card reads it (training/card_train.py). Nothing is written where
phase_log is ''."""
import json
import time

import torch

from training.errors import ConfigError, first_line


class PhaseLog:
    def __init__(self, path, device=None):
        """Appends to `path` ('' for none); device: the CUDA device whose time and memory the lines give (None off
        CUDA). ConfigError, one line, where the file cannot be written."""
        self.start = time.perf_counter()
        self.device = device
        try:
            self.file = open(path, 'a', encoding='utf-8') if path else None
        except OSError as e:
            raise ConfigError(f"phase_log={path!r} cannot be written ({first_line(e)}): pass a writable path, or '' "
                              f"for none") from None

    def enter(self, phase, iter_num=None):
        """The line of `phase` (of iteration iter_num), written and flushed at once: a run killed later keeps it."""
        if self.file is None:
            return
        line = dict(phase=phase, iter=iter_num)
        if self.device is not None: # the GPU's work so far counted in the phase that queued it, not the next one
            torch.cuda.synchronize(self.device)
            line.update(max_allocated_bytes=torch.cuda.max_memory_allocated(self.device),
                        max_reserved_bytes=torch.cuda.max_memory_reserved(self.device))
        line['seconds'] = time.perf_counter() - self.start
        self.file.write(json.dumps(line) + '\n')
        self.file.flush()


def read(path):
    """The lines of a phase log as dicts, in order; none for a missing file. A line cut short by a kill is left out."""
    try:
        with open(path, encoding='utf-8') as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return []
    events = []
    for line in lines:
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return events
