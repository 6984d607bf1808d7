"""A small GAN: two optimizers; the discriminator's step has two backward passes."""
import torch
import torch.nn as nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
G = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 8)).to(device)
D = nn.Sequential(nn.Linear(8, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1), nn.Sigmoid()).to(device)
opt_g = torch.optim.Adam(G.parameters(), lr=2e-3, betas=(0.5, 0.999))
opt_d = torch.optim.Adam(D.parameters(), lr=2e-3, betas=(0.5, 0.999))
criterion = nn.BCELoss()
reals = torch.randn(10, 32, 8) + 2.0  # on the host: one batch goes to the device at a time
for i in range(10):
    real = reals[i].to(device)
    ones = torch.ones(32, 1, device=device)
    zeros = torch.zeros(32, 1, device=device)
    D.zero_grad()
    loss_real = criterion(D(real), ones)
    loss_real.backward()
    fake = G(torch.randn(32, 4, device=device))
    loss_fake = criterion(D(fake.detach()), zeros)
    loss_fake.backward()
    opt_d.step()
    G.zero_grad()
    loss_g = criterion(D(fake), ones)
    loss_g.backward()
    opt_g.step()
print("done")
