"""The Moshi-architecture language model, `LMModel`: its weights and its two forward paths.

Parameter names are identical to moshi 0.2.13's split layout, with the depformer cut to the 8 agent
codebooks: the temporal transformer over any number of frames, and one depformer codebook step. Streaming
over call slots (offsets, KV ring, token ring, sampling) is `duetaspan.model.generator.LMGenerator`.

Example:
    >>> import torch
    >>> from duetaspan.model.lm import LMModel
    >>> from duetaspan.model.lm_config import LMConfig
    >>> model = LMModel(LMConfig.preset("tiny-random")).eval()
    >>> model.embed(model.initial_tokens()[None, :, None]).shape[-1] == model.config.dim
    True
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from duetaspan.model.convention import ZERO_TOKEN_ID
from duetaspan.model.lm_config import LMConfig
from duetaspan.model.transformer import DepthTransformer, RMSNorm, TemporalKV, TemporalTransformer


class LMModel(nn.Module):
    """Temporal + depth transformer with Moshi's parameter names (`emb.N`, `text_emb`, `transformer.…`).

    The depformer always has `config.gen_q` (8) steps: a checkpoint with dep_q=16 is sliced at load time.
    Build on `device="meta"` to inspect shapes without memory.
    """

    def __init__(self, config: LMConfig, device=None, dtype=None) -> None:
        super().__init__()
        self.config = config
        c = config
        kw = {"device": device, "dtype": dtype}
        self.emb = nn.ModuleList([nn.Embedding(c.card + 1, c.dim, **kw) for _ in range(c.n_q)])
        self.text_emb = nn.Embedding(c.text_card + 1, c.dim, **kw)
        self.text_linear = nn.Linear(c.dim, c.text_vocab_out, bias=False, **kw)
        self.transformer = TemporalTransformer(
            c.dim, c.num_heads, c.num_layers, c.ffn_hidden, c.norm_eps, c.context, c.max_period, **kw
        )
        self.out_norm = RMSNorm(c.dim, c.norm_eps, device=device)
        n_in = c.gen_q if c.depformer_multi_linear else 1
        self.depformer_in = nn.ModuleList(
            [nn.Linear(c.dim, c.depformer_dim, bias=False, **kw) for _ in range(n_in)]
        )
        self.depformer_emb = nn.ModuleList(
            [nn.Embedding(c.card + 1, c.depformer_dim, **kw) for _ in range(c.gen_q - 1)]
        )
        self.depformer_text_emb = nn.Embedding(c.text_card + 1, c.depformer_dim, **kw)
        self.depformer = DepthTransformer(
            c.depformer_dim, c.depformer_num_heads, c.depformer_num_layers, c.depformer_ffn_hidden,
            c.norm_eps, c.gen_q, **kw,
        )  # fmt: skip
        self.linears = nn.ModuleList(
            [nn.Linear(c.depformer_dim, c.card, bias=False, **kw) for _ in range(c.gen_q)]
        )

    @property
    def device(self) -> torch.device:
        return self.text_emb.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.text_emb.weight.dtype

    def initial_tokens(self, device=None) -> torch.Tensor:
        """The "beginning of stream" column [17]: text_card for text, card for every audio stream."""
        c = self.config
        return torch.tensor([c.text_card] + [c.card] * c.n_q, dtype=torch.long, device=device)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """Sum of the 17 stream embeddings of `tokens` [B, 17, T] -> [B, T, dim] (audio 1..16, then text).

        Token -1 (the "zero token") contributes an exact zero vector.
        """
        # One clamp and one zero-token test for all streams; the per-stream sum keeps its order (bit-exact).
        ids = tokens.clamp(min=0).unbind(1)
        zero = (tokens == ZERO_TOKEN_ID).unsqueeze(-1).unbind(1)
        x = F.embedding(ids[1], self.emb[0].weight).masked_fill(zero[1], 0.0)
        for k in range(1, self.config.n_q):
            x = x + F.embedding(ids[k + 1], self.emb[k].weight).masked_fill(zero[k + 1], 0.0)
        return x + F.embedding(ids[0], self.text_emb.weight).masked_fill(zero[0], 0.0)

    def forward_text(
        self,
        tokens: torch.Tensor,
        state: TemporalKV,
        offsets: torch.Tensor,
        active: torch.Tensor | None = None,
        last_only: bool = False,
        kv_len: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Temporal pass over delayed token columns [B, 17, T] -> (hidden [B, T, dim], text logits [B, T', V]).

        `last_only` computes text logits for the last column only (T' = 1), as a prefill needs; `kv_len` is
        the `TemporalTransformer.forward` hint.
        """
        x = self.transformer(self.embed(tokens), state, offsets, active, kv_len)
        x = self.out_norm(x)
        return x, self.text_linear(x[:, -1:] if last_only else x)

    def depformer_step(
        self,
        step: int,
        prev_token: torch.Tensor,
        hidden: torch.Tensor,
        kv: torch.Tensor | list[tuple[torch.Tensor, torch.Tensor]],
    ) -> torch.Tensor:
        """Logits [B, card] of agent codebook `step` given the previous sampled token (text for step 0) [B].

        `kv` is the depformer scratch KV (or its `DepthTransformer.split_kv` views, split once per frame).
        """
        proj = F.linear(hidden, self.depformer_in[step if len(self.depformer_in) > 1 else 0].weight)
        emb = self.depformer_text_emb if step == 0 else self.depformer_emb[step - 1]
        # Sampled ids are never the zero token (-1): a plain lookup, no zero-vector masking.
        x = proj + F.embedding(prev_token[:, None], emb.weight)
        return F.linear(self.depformer(x, step, kv), self.linears[step].weight)[:, 0]
