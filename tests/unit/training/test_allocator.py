"""training/allocator.py: train.py's allocator settings, which bench.py applies too, and a user's own that win."""
import os

from training.allocator import use_train_allocator


def test_expandable_segments_unless_the_user_configured_the_allocator(monkeypatch):
    monkeypatch.delenv('PYTORCH_CUDA_ALLOC_CONF', raising=False)
    monkeypatch.delenv('PYTORCH_ALLOC_CONF', raising=False)
    use_train_allocator()
    assert os.environ['PYTORCH_CUDA_ALLOC_CONF'] == 'expandable_segments:True'
    for name in ('PYTORCH_CUDA_ALLOC_CONF', 'PYTORCH_ALLOC_CONF'):
        monkeypatch.delenv('PYTORCH_CUDA_ALLOC_CONF', raising=False)
        monkeypatch.setenv(name, 'max_split_size_mb:128')
        use_train_allocator()
        assert os.environ[name] == 'max_split_size_mb:128'
        assert name == 'PYTORCH_CUDA_ALLOC_CONF' or 'PYTORCH_CUDA_ALLOC_CONF' not in os.environ
