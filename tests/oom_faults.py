"""CUDA's out-of-memory error, raised where a test asks for it: in the model's forward, in training or evaluation."""

from __future__ import annotations

import pytest
import torch
from transformers.models.bert.modeling_bert import BertForQuestionAnswering

# torch 2.13's CUDA caching allocator, word for word (an H100 asked for a 2.25 GiB block)
CUDA_OOM = (
    "CUDA out of memory. Tried to allocate 2.25 GiB. GPU 0 has a total capacity of 79.11 GiB of which 1.06 GiB "
    "is free. Including non-PyTorch memory, this process has 78.04 GiB memory in use. Of the allocated memory "
    "76.50 GiB is allocated by PyTorch, and 1.02 GiB is reserved by PyTorch but unallocated. If reserved but "
    "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
    "fragmentation.  See documentation for Memory Management  "
    "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
)


def fail_forward(monkeypatch: pytest.MonkeyPatch, training: bool, fail) -> None:
    real = BertForQuestionAnswering.forward

    def forward(self, *args, **kwargs):
        if self.training == training:
            fail()
        return real(self, *args, **kwargs)

    monkeypatch.setattr(BertForQuestionAnswering, "forward", forward)


def cuda_oom() -> None:
    raise torch.OutOfMemoryError(CUDA_OOM)
