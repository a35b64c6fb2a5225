"""Triton kernels of tritondtr, installed as ``tritondtr.kernels``.

They import torch and triton and nothing of tritondtr; their torch twins (the specification)
live in :mod:`tritondtr.scoring`.
"""
