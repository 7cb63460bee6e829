"""training/phase_log.py: train.py's phase log, a JSON line as each phase begins, read back as it was written, and
nothing written without a path."""
import pytest

from training.errors import ConfigError
from training.phase_log import PhaseLog, read


def test_each_phase_is_a_line_in_order_with_its_iteration_and_growing_seconds(tmp_path):
    log = PhaseLog(str(tmp_path / 'phases'))
    for phase, it in (('build', None), ('evaluation', 0), ('step', 0), ('done', 1)):
        log.enter(phase, it)
    events = read(tmp_path / 'phases')
    assert [(e['phase'], e['iter']) for e in events] == [('build', None), ('evaluation', 0), ('step', 0), ('done', 1)]
    seconds = [e['seconds'] for e in events]
    assert seconds == sorted(seconds) and seconds[0] >= 0
    assert 'max_allocated_bytes' not in events[0]  # off CUDA: no memory counters


def test_a_line_cut_short_by_a_kill_ends_the_log_and_a_missing_log_is_empty(tmp_path):
    (tmp_path / 'phases').write_text('{"phase": "build", "iter": null, "seconds": 0.1}\n{"phase": "ev')
    assert read(tmp_path / 'phases') == [dict(phase='build', iter=None, seconds=0.1)]
    assert read(tmp_path / 'none') == []


def test_no_path_writes_nothing_and_an_unwritable_one_is_one_line(tmp_path):
    PhaseLog('').enter('build')
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ConfigError, match=r"phase_log='.*missing/phases' cannot be written \(.*\): pass a writable"):
        PhaseLog(str(tmp_path / 'missing' / 'phases'))
