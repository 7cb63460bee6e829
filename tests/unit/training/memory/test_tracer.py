"""training/memory/tracer.py: the traced peak of a step against the peak of the same step run for real on the CPU."""
import gc

import pytest
from torch.profiler import ProfilerActivity, profile

from training.memory import estimate as em


def real_cpu_peak(config):
    """Peak of allocated bytes over a real CPU run of build + train_iterations, from the profiler's memory events
    (each event is +bytes or -bytes, in time order)."""
    gc.collect()  # nothing allocated before the profile may be freed during it
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        model, optimizer = em.build(config)
        em.train_iterations(model, optimizer, config, config['batch_size'], 'cpu')
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == '[memory]'),
                    key=lambda e: e.start_ns())
    current = peak = 0
    for event in events:
        current += event.nbytes()
        peak = max(peak, current)
    return peak


@pytest.mark.parametrize('checkpointing', [False, True])
def test_traced_peak_matches_real_cpu_peak(tiny, checkpointing):
    config = {**tiny, 'activation_checkpointing': checkpointing}
    traced = em.trace(config, alignment=1)['train']['peak_bytes']  # the CPU allocator does not round to 512
    real = real_cpu_peak(config)
    assert traced == pytest.approx(real, rel=0.02)
