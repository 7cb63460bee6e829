"""torch.compile that returns a model whose every call hangs, as a compilation that never ends: what the card's
per-preset limit (card_preset_seconds) must stop."""
import time

import torch


def hung_compile(model, *args, **kwargs):
    def call(*args, **kwargs):
        while True:
            time.sleep(1)
    return call


torch.compile = hung_compile
