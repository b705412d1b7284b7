"""Test-session set-up shared by tests/, the package doctests and the docs' examples."""

import torch

# The suite checks numbers, not speed: the batched programs it runs are small, and on a 2-core
# machine shared with other jobs a second OpenMP thread spin-waits (measured 5-10x slower), so the
# whole suite runs single-threaded. Benchmarks (`fedrl bench`) choose their own thread count.
torch.set_num_threads(1)
