"""A small decoder block whose attention goes through F.scaled_dot_product_attention, spelled
three ways: causal self-attention with dropout in training, cross-attention over a padded
memory (a boolean mask, an explicit scale), and self-attention with a learned additive bias
(a float mask), with the feature probe code of this kind keeps for older torch versions."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.functional import scaled_dot_product_attention as attend


class CausalSelfAttention(nn.Module):
    def __init__(self, dim, heads, dropout=0.1):
        super().__init__()
        self.heads = heads
        self.to_qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim)
        self.attn_p = dropout
        self.fused = hasattr(F, "scaled_dot_product_attention")

    def forward(self, x):
        b, t, d = x.shape
        qkv = self.to_qkv(x).reshape(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        if not self.fused:
            raise RuntimeError("this block needs torch >= 2.0")
        y = F.scaled_dot_product_attention(q, k, v, None, self.attn_p if self.training else 0.0, True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class CrossAttention(nn.Module):
    def __init__(self, dim, heads, dropout=0.1):
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * dim)
        self.dropout = dropout

    def forward(self, x, memory, keep):
        b, t, d = x.shape
        s = memory.shape[1]
        h = self.heads
        q = self.q(x).view(b, t, h, d // h).transpose(1, 2)
        k, v = self.kv(memory).chunk(2, dim=-1)
        k = k.view(b, s, h, d // h).transpose(1, 2)
        v = v.view(b, s, h, d // h).transpose(1, 2)
        y = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=keep[:, None, None, :], dropout_p=self.dropout if self.training else 0,
            scale=0.5 / math.sqrt(d // h))
        return y.transpose(1, 2).reshape(b, t, d)


class BiasedSelfAttention(nn.Module):
    def __init__(self, dim, heads, length, p=0.1):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.rel = nn.Parameter(torch.linspace(-1.0, 1.0, heads * length * length).view(heads, length, length))
        self.p = p

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        q = q.transpose(1, 2)
        k = k.transpose(1, 2)
        v = v.transpose(1, 2)
        y = attend(q, k, v, self.rel[:, :t, :t], dropout_p=self.p if self.training else 0)
        return y.transpose(1, 2).flatten(2)


class Block(nn.Module):
    def __init__(self, dim=16, heads=4, length=8, dropout=0.1):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads, dropout)
        self.ln2 = nn.LayerNorm(dim)
        self.cross = CrossAttention(dim, heads, dropout)
        self.ln3 = nn.LayerNorm(dim)
        self.biased = BiasedSelfAttention(dim, heads, length, dropout)

    def forward(self, x, memory, keep):
        x = x + self.attn(self.ln1(x))
        x = x + self.cross(self.ln2(x), memory, keep)
        return x + self.biased(self.ln3(x))
