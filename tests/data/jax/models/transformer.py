"""A small Transformer encoder classifier with padding masks (written for porter's JAX module tests)."""
import torch
import torch.nn as nn


class EncoderBlock(nn.Module):
    def __init__(self, d_model, nhead, dim_ff, dropout=0.1):
        super().__init__()
        self.self_attn = nn.MultiheadAttention(d_model, nhead, dropout=dropout, batch_first=True)
        self.norm1 = nn.LayerNorm(d_model)
        self.ff = nn.Sequential(
            nn.Linear(d_model, dim_ff),
            nn.GELU(),
            nn.Dropout(dropout),
            nn.Linear(dim_ff, d_model),
        )
        self.norm2 = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, padding_mask):
        attn, _ = self.self_attn(x, x, x, key_padding_mask=padding_mask, need_weights=False)
        x = self.norm1(x + self.dropout(attn))
        x = self.norm2(x + self.dropout(self.ff(x)))
        return x


class TransformerClassifier(nn.Module):
    def __init__(self, vocab_size, num_classes, d_model=32, nhead=4, num_layers=2, dim_ff=64, max_len=64, dropout=0.1):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model, padding_idx=0)
        self.pos = nn.Parameter(torch.zeros(1, max_len, d_model))
        self.layers = nn.ModuleList([EncoderBlock(d_model, nhead, dim_ff, dropout) for _ in range(num_layers)])
        self.norm = nn.LayerNorm(d_model, eps=1e-6)
        self.head = nn.Linear(d_model, num_classes)

    def forward(self, tokens, padding_mask):
        x = self.embed(tokens) + self.pos[:, : tokens.shape[1]]
        for layer in self.layers:
            x = layer(x, padding_mask)
        x = self.norm(x)
        return self.head(x[:, 0])
