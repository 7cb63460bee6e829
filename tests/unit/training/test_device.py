"""training/device.py: the device and dtype check, and the GPUs' peak FLOPS."""
import pytest
import torch

from training.device import check_device, peak_flops
from training.errors import ConfigError


@pytest.mark.parametrize('device, dtype, match', [
    ('cpu', 'float8', "unknown dtype 'float8'"),
    ('tpu', 'float32', "device 'tpu'"),
    ('cpu', 'float16', 'float16 needs CUDA'),
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
    names = {'NVIDIA GeForce RTX 3060': 25.5e12, 'NVIDIA GeForce RTX 3060 Ti': 32.4e12,
             'NVIDIA A100-SXM4-80GB': 312e12, 'NVIDIA A10G': 70e12, 'NVIDIA H100 PCIe': 756e12,
             'NVIDIA H100 80GB HBM3': 989e12, 'NVIDIA L40S': 362e12, 'NVIDIA L4': 121e12}
    for name, flops in names.items():
        monkeypatch.setattr(torch.cuda, 'get_device_name', lambda device, name=name: name)
        assert peak_flops('cuda:0') == (flops, name)
    for name in ('NVIDIA GeForce RTX 3060 Laptop GPU', 'Some Future GPU'):
        monkeypatch.setattr(torch.cuda, 'get_device_name', lambda device, name=name: name)
        assert peak_flops('cuda') is None
