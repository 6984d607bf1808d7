"""A word-level LSTM language model (written for porter's JAX module tests)."""
import torch
import torch.nn as nn


class RNNModel(nn.Module):
    def __init__(self, ntoken, ninp=64, nhid=96, nlayers=2, dropout=0.5, tie_weights=False):
        super().__init__()
        self.ntoken = ntoken
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout, batch_first=True)
        self.decoder = nn.Linear(nhid, ntoken)
        self.nlayers = nlayers
        self.nhid = nhid

    def forward(self, input, hidden=None):
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        output = self.drop(output)
        decoded = self.decoder(output)
        return decoded, hidden
