"""Visual-Query-Tuning-style pooling (Tu et al. 2023) from cached tokens, for bench/studies/tokens_study.py: q learned
query tokens are appended to layer l's input and pass through the frozen layer l (its own attention and feed-forward)
attending over the text's cached layer-(l-1) tokens and each other; the text's tokens do not attend to the queries,
so their states (and the features) are unchanged and need not be recomputed. Only the queries are trained; the
layer's weights are the encoder's, frozen. Each query's output is standardised with statistics measured at the
start on the train texts (fixed), so the head's input starts at unit scale.
"""
from __future__ import annotations

import torch

from headstore.featurize.encoder.architectures import transformer_layers
from headstore.featurize.encoder.model import load_encoder


class VqtPool(torch.nn.Module):
    def __init__(self, model_name: str, max_length: int, layers: list[int], queries: int, sample: list[torch.Tensor],
                 sample_mask: torch.Tensor):
        super().__init__()
        model = load_encoder(model_name, "cpu", max_length).model
        self.blocks = [transformer_layers(model)[i - 1] for i in layers]  # frozen: not registered as submodules
        d = sample[0].shape[-1]
        # VQT's queries start random; here at the scale of the layer's input tokens
        self.queries = torch.nn.ParameterList([
            torch.nn.Parameter(torch.randn(queries, d) * float(h[sample_mask].std())) for h in sample])
        with torch.no_grad():
            outs = self.raw(sample, sample_mask)
        self.stats = [(o.mean(0), o.std(0).clamp_min(1e-6)) for o in outs]  # (q, d) each

    def raw(self, tokens: list[torch.Tensor], mask: torch.Tensor) -> list[torch.Tensor]:
        """Per layer, the queries' outputs of the frozen layer: (B, q, d)."""
        return [self._layer(block, query, h, mask) for block, query, h in zip(self.blocks, self.queries, tokens)]

    @staticmethod
    def _layer(block, query: torch.Tensor, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        att = block.attention.self
        n, hd = att.num_attention_heads, att.attention_head_size
        b, q = h.shape[0], query.shape[0]
        z = query[None].expand(b, -1, -1)
        x = torch.cat([h, z], 1)
        split = lambda t: t.view(b, t.shape[1], n, hd).transpose(1, 2)  # noqa: E731
        keep = torch.cat([mask, torch.ones(b, q, dtype=torch.bool)], 1)[:, None, None, :]
        ctx = torch.nn.functional.scaled_dot_product_attention(
            split(att.query(z)), split(att.key(x)), split(att.value(x)), attn_mask=keep)
        ctx = ctx.transpose(1, 2).reshape(b, q, n * hd)
        a = block.attention.output.LayerNorm(block.attention.output.dense(ctx) + z)
        return block.output.LayerNorm(block.output.dense(block.intermediate(a)) + a)

    def forward(self, tokens: list[torch.Tensor], mask: torch.Tensor) -> list[torch.Tensor]:
        """Per layer and query, (B, d) standardised and scaled to unit size."""
        out = []
        for o, (mu, sd) in zip(self.raw(tokens, mask), self.stats):
            out.extend(((o - mu) / sd * o.shape[-1] ** -0.5).unbind(1))
        return out
