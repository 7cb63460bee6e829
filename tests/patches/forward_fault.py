"""GPT.forward fails in one mode from its AT-th call in that mode on, as $FORWARD_FAULT='KIND MODE AT' says: KIND
`nan` (the loss turns nan) or `oom` (CUDA's out-of-memory error), MODE `training` or `evaluation`."""
import os

import torch

import model

KIND, MODE, AT = os.environ['FORWARD_FAULT'].split()
forward, calls = model.GPT.forward, [0]


def faulty_forward(self, idx, targets=None, **kwargs):
    if self.training == (MODE == 'training'):
        calls[0] += 1
        if calls[0] >= int(AT) and KIND == 'oom':
            raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 2.00 GiB')
        if calls[0] >= int(AT) and KIND == 'nan':
            return None, forward(self, idx, targets, **kwargs)[1] * float('nan')
    return forward(self, idx, targets, **kwargs)


model.GPT.forward = faulty_forward
