"""torch as 2.11 is, where the GPU suite ran: no F.linear_cross_entropy with LinearCrossEntropyOptions (bench.py's
loss=torch), which torch 2.13 brought."""
import torch

if hasattr(torch.nn, 'LinearCrossEntropyOptions'): # requirements.txt allows torches without it already
    del torch.nn.LinearCrossEntropyOptions
