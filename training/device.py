"""The machine: the defaults that suit it (the device, dtype, compile and backend that train.py's keys default to), the
check that a device and dtype can run here, and the peak throughput of known GPUs, which MFU is measured against."""
import torch

from training.errors import ConfigError

GIB = 2 ** 30
DTYPES = ('float32', 'bfloat16', 'float16')
TORCH_DTYPES = {'float32': torch.float32, 'bfloat16': torch.bfloat16, 'float16': torch.float16}


def default_device():
    return 'cuda' if torch.cuda.is_available() else 'cpu'


def cuda_has_bf16():
    """Whether the GPU computes in bf16 natively (Ampere and later). torch.cuda.is_bf16_supported() also counts
    the emulated bf16 of older cards (T4, V100), which is slow."""
    return torch.cuda.get_device_capability() >= (8, 0)


def default_dtype(device):
    """bfloat16 on a GPU that has it, else float16 (trained with a GradScaler); float32 off CUDA."""
    if not device.startswith('cuda'):
        return 'float32'
    return 'bfloat16' if cuda_has_bf16() else 'float16'


def matmul_dtype(config):
    """The dtype config's matrix products run in: autocast's (dtype), or without autocast the weights'."""
    return TORCH_DTYPES[config['dtype'] if config['dtype'] != 'float32' else config['weight_dtype']]


def default_compile(device):
    """torch.compile on CUDA: its Triton kernels pay back the compile time there."""
    return device == 'cuda'


def default_backend():
    """torch.distributed's backend: nccl where there is a GPU, gloo on the CPU."""
    return 'nccl' if torch.cuda.is_available() else 'gloo'


# Dense tensor-core peak of bf16 matmuls with fp32 accumulation (fp16 on cards without bf16), in TFLOPS, by a
# substring of torch.cuda.get_device_name(); more specific names first ('RTX 3060 Ti' before 'RTX 3060'). Sources
# are listed in the README (Differences from nanoGPT, MFU); GeForce cards accumulate in fp32 at half their
# fp16-accumulate rate.
PEAK_TFLOPS = (
    ('RTX 3060 Ti', 32.4), ('RTX 3060', 25.5), ('RTX 3070', 40.6), ('RTX 3080 Ti', 68.2), ('RTX 3080', 59.5),
    ('RTX 3090 Ti', 80.0), ('RTX 3090', 71.2), ('RTX 4060 Ti', 44.1), ('RTX 4060', 30.2),
    ('RTX 4070 Ti SUPER', 88.2), ('RTX 4070 Ti', 80.2), ('RTX 4070 SUPER', 71.0), ('RTX 4070', 58.3),
    ('RTX 4080 SUPER', 104.4), ('RTX 4080', 97.5), ('RTX 4090', 165.2), ('RTX 5070 Ti', 87.9), ('RTX 5070', 61.7),
    ('RTX 5080', 112.6), ('RTX 5090', 209.5), ('RTX A4000', 76.7), ('RTX A5000', 111.1), ('RTX A6000', 154.8),
    ('RTX 6000 Ada', 364.0), ('A100', 312.0), ('A10G', 70.0), ('A10', 125.0), ('H100 PCIe', 756.0),
    ('H100 NVL', 835.0), ('H100', 989.0), ('H200 NVL', 835.0), ('H200', 989.0), ('L40S', 362.0), ('L40', 181.0),
    ('L4', 121.0), ('T4', 65.0), ('V100', 125.0),
)


def peak_flops(device):
    """(FLOPS, card name) of `device`'s dense bf16 peak, for MFU; None off CUDA or for a card not in PEAK_TFLOPS
    (laptop GPUs run at lower clocks than the desktop cards of the same name)."""
    if not device.startswith('cuda'):
        return None
    name = torch.cuda.get_device_name(device)
    if 'Laptop' in name:
        return None
    return next(((tflops * 1e12, name) for key, tflops in PEAK_TFLOPS if key in name), None)


def check_device(device, dtype):
    """A ConfigError if `device` or `dtype` is unknown or cannot work on this machine; else the device type."""
    if dtype not in DTYPES:
        raise ConfigError(f"unknown dtype {dtype!r}: use one of {', '.join(DTYPES)}")
    try:
        device_type = torch.device(device).type
    except RuntimeError:
        raise ConfigError(f"unknown device {device!r}: use 'cpu', 'cuda', 'cuda:N' or 'mps'") from None
    if device_type == 'cuda':
        if not torch.cuda.is_available():
            raise ConfigError(f"device={device!r} but CUDA is not available here (torch {torch.__version__}, "
                              f"no usable GPU): use --device=cpu")
        index = torch.device(device).index
        if index is not None and index >= torch.cuda.device_count():
            raise ConfigError(f'device={device!r} but this machine has {torch.cuda.device_count()} CUDA device(s)')
        if dtype == 'bfloat16' and not cuda_has_bf16():
            raise ConfigError('dtype=bfloat16 is not supported by this GPU: use --dtype=float16')
    elif device_type == 'mps':
        if not torch.backends.mps.is_available():
            raise ConfigError(f'device={device!r} but MPS is not available here: use --device=cpu')
    elif device_type != 'cpu':
        raise ConfigError(f"unsupported device {device!r}: use 'cpu', 'cuda', 'cuda:N' or 'mps'")
    if device_type == 'cpu' and dtype == 'float16':
        raise ConfigError('dtype=float16 runs on CUDA here (training needs its GradScaler, CUDA only): on cpu use '
                          '--dtype=float32 or --dtype=bfloat16')
    return device_type


def memory_fraction(cap_bytes, total_bytes):
    """The fraction of a GPU of total_bytes that leaves its caching allocator cap_bytes (train.py's memory_cap_gb);
    ConfigError where the cap is more than the GPU has."""
    if cap_bytes > total_bytes:
        raise ConfigError(f'memory_cap_gb={cap_bytes / GIB:g} is more than this GPU has ({total_bytes / GIB:.2f} '
                          f'GiB): use a smaller cap, or 0 for none')
    return cap_bytes / total_bytes


def cap_memory(device, cap_gib):
    """This process's CUDA caching allocator on `device` held to cap_gib GiB (set_per_process_memory_fraction), as a
    card of that size would hold it: a larger GPU then runs out of memory where that card would. Called before the
    first allocation, so that nothing is reserved beyond it."""
    index = torch.device(device).index # 'cuda' names the current GPU, which the allocator takes only by index
    index = torch.cuda.current_device() if index is None else index
    total = torch.cuda.get_device_properties(index).total_memory
    torch.cuda.set_per_process_memory_fraction(memory_fraction(cap_gib * GIB, total), index)
