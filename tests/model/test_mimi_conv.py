"""Streaming convs: chunked streaming equals one offline pass, and the CPU matmul forms equal torch's kernels."""

from __future__ import annotations

import pytest
import torch

from duetaspan.model.mimi.conv import (
    StreamingConv1d,
    StreamingConvTranspose1d,
    _conv1d_as_matmul,
    _conv_transpose1d_as_matmul,
)


@pytest.mark.parametrize(
    ("kernel", "stride", "dilation"), [(7, 1, 1), (3, 1, 2), (8, 4, 1), (4, 2, 1), (1, 1, 1)]
)
def test_chunked_streaming_equals_offline(kernel, stride, dilation):
    torch.manual_seed(0)
    conv = StreamingConv1d(3, 5, kernel, stride, dilation=dilation)
    convtr = StreamingConvTranspose1d(5, 3, max(kernel, stride), stride)
    x = torch.randn(2, 3, 12 * stride)
    with torch.no_grad():
        y, z = conv(x), convtr(conv(x))
        cs, ts = conv.init_state(2), convtr.init_state(2)
        ys, zs = [], []
        for chunk in x.split(2 * stride, dim=-1):
            ys.append(conv(chunk, cs))
            zs.append(convtr(ys[-1], ts))
    torch.testing.assert_close(torch.cat(ys, -1), y, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(torch.cat(zs, -1), z, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize(
    ("c_in", "c_out", "kernel", "stride", "dilation", "steps"),
    [(64, 32, 16, 8, 1, 24), (48, 40, 3, 1, 2, 9), (32, 16, 7, 1, 1, 8)],
)
def test_matmul_conv_equals_torch(c_in, c_out, kernel, stride, dilation, steps):
    torch.manual_seed(1)
    conv = torch.nn.Conv1d(c_in, c_out, kernel, stride, dilation=dilation)
    x = torch.randn(3, c_in, steps)
    with torch.no_grad():
        torch.testing.assert_close(_conv1d_as_matmul(conv, x), conv(x), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(
    ("c_in", "c_out", "kernel", "stride", "steps"), [(64, 32, 16, 8, 2), (40, 24, 6, 3, 5)]
)
def test_matmul_conv_transpose_equals_torch(c_in, c_out, kernel, stride, steps):
    torch.manual_seed(2)
    convtr = torch.nn.ConvTranspose1d(c_in, c_out, kernel, stride)
    x = torch.randn(2, c_in, steps)
    with torch.no_grad():
        torch.testing.assert_close(_conv_transpose1d_as_matmul(convtr, x), convtr(x), atol=1e-5, rtol=1e-4)


def test_replicate_padding_seeds_from_the_first_sample_and_reset_restores_it():
    torch.manual_seed(3)
    conv = StreamingConv1d(2, 2, 4, 2, bias=False, pad_mode="replicate")
    x = torch.randn(2, 2, 8)
    with torch.no_grad():
        offline = conv(x)
        state = conv.init_state(2)
        first = conv(x[..., :4], state)
        conv(x[..., 4:], state)
        state.reset(torch.tensor([True, False]))
        again = conv(x[..., :4], state)
    torch.testing.assert_close(first, offline[..., :2])
    torch.testing.assert_close(again[:1], first[:1])
