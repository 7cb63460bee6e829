"""train.py's configuration of the CUDA caching allocator, shared by every script that measures what train.py would
reserve (bench.py): one function, called before torch is imported, as the allocator reads it when CUDA first starts.
It imports nothing but os, so calling it first keeps torch's import after it."""
import os


def use_train_allocator():
    """Expandable segments, which make fragmentation-driven OOMs rarer, unless the user configured the allocator."""
    if 'PYTORCH_CUDA_ALLOC_CONF' not in os.environ and 'PYTORCH_ALLOC_CONF' not in os.environ:
        os.environ['PYTORCH_CUDA_ALLOC_CONF'] = 'expandable_segments:True'
