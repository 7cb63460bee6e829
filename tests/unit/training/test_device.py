"""training/device.py: the device and dtype check, and the GPUs' peak FLOPS."""
import types

import pytest
import torch

from training.device import GIB, PEAK_TFLOPS, cap_memory, check_device, memory_fraction, peak_flops
from training.errors import ConfigError


@pytest.mark.parametrize('device, dtype, match', [
    ('cpu', 'float8', "unknown dtype 'float8'"),
    ('tpu', 'float32', "device 'tpu'"),
    ('cpu', 'float16', 'float16 runs on CUDA here'),
])
def test_check_device_errors(device, dtype, match):
    with pytest.raises(ConfigError, match=match):
        check_device(device, dtype)


@pytest.mark.skipif(torch.cuda.is_available(), reason='needs a machine without CUDA')
def test_check_device_without_cuda():
    with pytest.raises(ConfigError, match='CUDA is not available'):
        check_device('cuda', 'float32')
    assert check_device('cpu', 'bfloat16') == 'cpu'  # bf16 autocast on cpu, when asked


def test_peak_flops_by_device_name(monkeypatch):
    assert peak_flops('cpu') is None
    tflops = dict(PEAK_TFLOPS)
    # names as torch reports them, and the entry each is: the most specific one that it contains
    names = {'NVIDIA GeForce RTX 3060': 'RTX 3060', 'NVIDIA GeForce RTX 3060 Ti': 'RTX 3060 Ti',
             'NVIDIA A100-SXM4-80GB': 'A100', 'NVIDIA A10G': 'A10G', 'NVIDIA H100 PCIe': 'H100 PCIe',
             'NVIDIA H100 80GB HBM3': 'H100', 'NVIDIA L40S': 'L40S', 'NVIDIA L4': 'L4'}
    for name, key in names.items():
        monkeypatch.setattr(torch.cuda, 'get_device_name', lambda device, name=name: name)
        assert peak_flops('cuda:0') == (tflops[key] * 1e12, name)
    for key, value in PEAK_TFLOPS:  # no entry is hidden by a shorter one before it ('RTX 3060' in 'RTX 3060 Ti')
        name = f'NVIDIA GeForce {key}'
        monkeypatch.setattr(torch.cuda, 'get_device_name', lambda device, name=name: name)
        assert peak_flops('cuda:0') == (value * 1e12, name)
    for name in ('NVIDIA GeForce RTX 3060 Laptop GPU', 'Some Future GPU'):
        monkeypatch.setattr(torch.cuda, 'get_device_name', lambda device, name=name: name)
        assert peak_flops('cuda') is None


@pytest.mark.parametrize('device, index', [('cuda', 0), ('cuda:1', 1)])
def test_the_cap_is_set_on_the_gpus_index_as_cuda_takes_it(monkeypatch, device, index):
    """torch.cuda.set_per_process_memory_fraction refuses a device without an index ('cuda', train.py's default): the
    stand-in refuses it as CUDA does, and the cap names the current GPU's index instead."""
    def set_fraction(fraction, device):  # CUDA's check, then the call recorded
        if not isinstance(device, int) and torch.device(device).index is None:
            raise ValueError(f'Expected a torch.device with a specified index or an integer, but got:{device}')
        calls.append((fraction, device))
    calls = []
    monkeypatch.setattr(torch.cuda, 'set_per_process_memory_fraction', set_fraction)
    monkeypatch.setattr(torch.cuda, 'current_device', lambda: 0)
    monkeypatch.setattr(torch.cuda, 'get_device_properties', lambda i: types.SimpleNamespace(total_memory=140 * GIB))
    cap_memory(device, 11)
    assert calls == [(pytest.approx(11 / 140), index)]


def test_the_memory_cap_is_its_share_of_the_gpu_and_never_more_than_the_gpu():
    assert memory_fraction(11 * GIB, 140 * GIB) == pytest.approx(11 / 140)
    assert memory_fraction(80 * GIB, 80 * GIB) == 1.0
    with pytest.raises(ConfigError, match=r'memory_cap_gb=23 is more than this GPU has \(11.76 GiB\): use a '
                                          r'smaller cap, or 0 for none'):
        memory_fraction(23 * GIB, int(11.76 * GIB))
