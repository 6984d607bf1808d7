from __future__ import annotations

import dataclasses

import libcst as cst

from porter import astutil
from porter.rules import Example, Fix, Rule, Safety, Severity

from . import _loop as lp

MANUAL = lp.MANUAL


class TrainStep(Rule):
    """
    ## What it does
    Turns the PyTorch training step of a loop body (`optimizer.zero_grad()`, the forward
    pass, `loss.backward()`, an optional `clip_grad_norm_`, `optimizer.step()`) into a call of
    a module-level `@nnx.jit` train step:

        @nnx.jit
        def train_step(model, optimizer, data, target):
            def loss_fn(model):
                output = model(data)
                loss = F.nll_loss(output, target)
                return loss, output
            (loss, output), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
            optimizer.update(model, grads)
            return loss, output

    The forward pass is what the loss depends on and what depends on a model (it calls one,
    or reads what such a statement computed); statements that do not touch a model (moving
    the batch, drawing noise, building labels) stay in the loop before the call, and those
    that read the forward pass without feeding the loss (an accuracy) come after it: the
    step returns the loss and every name of the forward pass the rest of the code reads.
    The model is the one the optimizer was built on (`optim.SGD(model.parameters())`,
    `nnx.Optimizer(model, ...)`). The step's parameters are the model, the optimizer and
    every local the forward pass reads; loss objects (`criterion = nn.CrossEntropyLoss()`)
    the fields of an argparse namespace (`args.clip`) and Python numbers fixed before the
    loop (`ntokens = args.vocab_size`, which may be a shape) are passed as static arguments.
    A name the forward pass reads and rebinds (`output, hidden = model(data, hidden)`) is an
    argument of `loss_fn` and is returned by the step, so the next iteration reads the new
    value (no gradient flows across steps, as with a detached hidden state). An array the
    forward pass makes from host data and nothing the step computes (`torch.LongTensor([
    vocab[word]])`, `np.array(rows[i])`: a lookup by a Python string, a row of a list) is made
    where the step is called and passed in (`word_array`): a string cannot be an argument of a
    jitted function, and NumPy inside it would see tracers, or values frozen at the first
    trace; NumPy's random draws stay where they are. Another model
    the forward pass calls (a GAN's generator in the discriminator's step) is an argument of
    `loss_fn` too (gradients are taken for the first argument only), so what its layers
    update (BatchNorm's running statistics) leaves the differentiated function. A branch of
    the forward pass on the script's settings (`if args.loss == "ce": loss = ...` /
    `else: loss = ...`) moves with it, the names its tests read being static arguments.
    `loss_fn` takes another name when the step reads one called so (a script's own
    `loss_fn = nn.CrossEntropyLoss()`).
    `clip_grad_norm_(model.parameters(), c)` becomes `optax.clip_by_global_norm(c)` applied
    to the gradients inside the step (`clip_grad_value_` -> `optax.clip`). Several
    `backward()` calls before one step sum their losses (gradients accumulate in PyTorch).
    A loop with two optimizers (a GAN's D and G steps) gets one step per optimizer; a
    forward statement of the first step that the second one's loss reads (`fake =
    netG(noise)`) is computed again inside the second step, so that its gradient reaches the
    second model. A call of a module-level helper of no arguments that only zeroes
    gradients (`def reset_grad(): d_opt.zero_grad(); g_opt.zero_grad()`) counts as the
    step's `zero_grad()`. A plain copy of a forward value (`real_score = scores`, no call)
    that a later forward statement rebinds is taken inside the step and returned, so the
    loop reads the value torch's loop reads.

    The optimizer may also be made by a factory: a method of the model's class returning an
    optimizer of `self`'s parameters (`optimizer = model.configure_optimizers(...)`, its
    parameter groups built from `self.named_parameters()`, or `nnx.Optimizer(self, ...)` once
    ported), or a function returning one built on a parameter (`make_optimizer(model, lr)`),
    in the file or in a file of the program it imports from. A statement that needs no model
    and rebinds what the forward pass read (`X, Y = get_batch('train')` between the forward
    pass and `backward()`) runs after the step call; one that only sets an attribute of the
    model (`model.require_backward_grad_sync = ...`) stays before it.

    Gradient accumulation, an inner loop of micro-steps holding the forward pass and
    `backward()` followed by the clipping, `optimizer.step()` and `optimizer.zero_grad()`,
    or a `backward()` every iteration with the step under an `if` (`if (i + 1) % accum ==
    0:`), becomes two jitted functions: `grad_step` (the forward pass under
    `nnx.value_and_grad`, returning the loss, what the loop reads and the gradients) called
    each micro-step, its gradients summed (`jax.tree.map(jnp.add, ...)`, as torch adds into
    `.grad`), and `update_step`, which clips the sum as torch does (`clip_grad_norm_`:
    coefficient `max_norm / (norm + 1e-6)`, at most 1; an `if` on the settings around the
    clip moves with it) and calls `optimizer.update`. The sum starts at `None` where torch
    zeroes the gradients. A loop that never zeroes them, or does other work between the
    micro-steps and the step, is reported at the loop with the reason.

    One step written out without a loop (a tutorial's: the forward pass, `backward()`,
    `step()` as statements of a script's top level or of a function) is rewritten the same
    way, from the first statement of its forward pass to `optimizer.step()`; a step found in
    a function is defined at module level. There `.grad` reads of the model's own arrays
    between `backward()` and `step()` (`linear.weight.grad` of a layer bound to a name) read
    the gradients the step returns (`grads["kernel"][...].T`, in torch's layout).

    In a method (a trainer class), the attributes the loop reads (`self.model`,
    `self.optimizer`, `self.criterion`, `self.args.clip`) are handled like local names: the
    step is still a module-level function and the loop passes it `self.model`, ...

    What the rewrite cannot handle (a host read such as `.item()` inside the forward pass,
    a backward nested in an `if`, an optimizer whose model porter cannot see, code between
    `backward()` and `step()`) is marked `# porter: manual` above the loop and reported.

    ## Why
    JAX has no `.grad` fields to accumulate into: gradients are the value of a function
    (`nnx.value_and_grad`) and the update is functional (`optimizer.update(model, grads)`).
    One jitted function per step is the unit XLA compiles once and runs on the device, with
    no host round trip until the loop reads a value (`loss.item()` on logging steps).

    ## Fix safety
    Safe when each step is found as described: the same loss, the same gradients, the same
    update. Where a forward statement of one step is computed again in a later one (a GAN's
    generator pass, in the discriminator's step and in its own), safe when every model it
    calls is code of this file with no BatchNorm, dropout or random draw after construction
    (the second pass gives the first's values and has no other effect); otherwise unsafe (a
    second pass of a model with batch statistics updates them twice, dropout draws again).

    Several forward passes in one step's window may reuse names: a value of the first pass
    that the loop reads after the step is kept under a name of its own (`out_1 = out`), and
    array code between the passes that rebinds what the first pass read (`label.fill_(0.0)`)
    is computed inside the step, in its place.
    """

    code = "JX301"
    name = "jax-train-step"
    target = "jax"
    summary = "loss.backward(); optimizer.step() in a loop -> an @nnx.jit train_step with nnx.value_and_grad"
    severity = Severity.ERROR
    needs_text = (".backward(",)
    examples = [
        Example(
            """
            import torch.nn.functional as F
            import torch.optim as optim

            def train(model, train_loader, optimizer, log_interval):
                model.train()
                for batch_idx, (data, target) in enumerate(train_loader):
                    optimizer.zero_grad()
                    output = model(data)
                    loss = F.nll_loss(output, target)
                    loss.backward()
                    optimizer.step()
                    if batch_idx % log_interval == 0:
                        print(batch_idx, loss.item())

            def main(model):
                optimizer = optim.SGD(model.parameters(), lr=0.1)
            """,
            """
            import torch.nn.functional as F
            import torch.optim as optim
            import flax.nnx as nnx

            @nnx.jit
            def train_step(model, optimizer, data, target):
                def loss_fn(model):
                    output = model(data)
                    loss = F.nll_loss(output, target)
                    return loss
                loss, grads = nnx.value_and_grad(loss_fn)(model)
                optimizer.update(model, grads)
                return loss

            def train(model, train_loader, optimizer, log_interval):
                model.train()
                for batch_idx, (data, target) in enumerate(train_loader):
                    loss = train_step(model, optimizer, data, target)
                    if batch_idx % log_interval == 0:
                        print(batch_idx, loss.item())

            def main(model):
                optimizer = optim.SGD(model.parameters(), lr=0.1)
            """,
            title="the canonical loop",
        ),
        Example(
            """
            import torch
            import torch.nn.functional as F
            import torch.optim as optim

            vocab = {"a": 0, "b": 1, "c": 2}


            def train(model, pairs):
                optimizer = optim.SGD(model.parameters(), lr=0.1)
                for x, word in pairs:
                    optimizer.zero_grad()
                    loss = F.cross_entropy(model(x), torch.LongTensor([vocab[word]]))
                    loss.backward()
                    optimizer.step()
            """,
            """
            import torch
            import torch.nn.functional as F
            import torch.optim as optim
            import flax.nnx as nnx

            vocab = {"a": 0, "b": 1, "c": 2}


            @nnx.jit
            def train_step(model, optimizer, x, word_array):
                def loss_fn(model):
                    loss = F.cross_entropy(model(x), word_array)
                    return loss
                loss, grads = nnx.value_and_grad(loss_fn)(model)
                optimizer.update(model, grads)
                return loss


            def train(model, pairs):
                optimizer = optim.SGD(model.parameters(), lr=0.1)
                for x, word in pairs:
                    loss = train_step(model, optimizer, x, torch.LongTensor([vocab[word]]))
            """,
            title="a target made from a Python string on the host: made where the step is called, passed in as an array",
        ),
        Example(
            """
            import torch
            import torch.nn as nn

            def fit(args, net, loader):
                criterion = nn.CrossEntropyLoss()
                opt = torch.optim.Adam(net.parameters())
                correct = 0
                for x, y in loader:
                    x, y = x.numpy(), y.numpy()
                    opt.zero_grad()
                    logits = net(x)
                    loss = criterion(logits, y)
                    loss.backward()
                    torch.nn.utils.clip_grad_norm_(net.parameters(), args.clip)
                    opt.step()
                    correct += (logits.argmax(1) == y).sum().item()
                return correct
            """,
            """
            import torch
            import torch.nn as nn
            import optax
            import flax.nnx as nnx

            @nnx.jit(static_argnames=("criterion", "clip"))
            def train_step(net, opt, x, y, criterion, clip):
                def loss_fn(net):
                    logits = net(x)
                    loss = criterion(logits, y)
                    return loss, logits
                (loss, logits), grads = nnx.value_and_grad(loss_fn, has_aux=True)(net)
                grads, _ = optax.clip_by_global_norm(clip).update(grads, optax.EmptyState())
                opt.update(net, grads)
                return loss, logits

            def fit(args, net, loader):
                criterion = nn.CrossEntropyLoss()
                opt = torch.optim.Adam(net.parameters())
                correct = 0
                for x, y in loader:
                    x, y = x.numpy(), y.numpy()
                    loss, logits = train_step(net, opt, x, y, criterion, args.clip)
                    correct += (logits.argmax(1) == y).sum().item()
                return correct
            """,
            title="outputs the loop reads, a loss object, gradient clipping with an argparse value",
        ),
        Example(
            """
            import torch

            def vae_epoch(model, optimizer, loader, beta):
                total = 0.0
                for data, _ in loader:
                    optimizer.zero_grad()
                    recon, mu, logvar = model(data)
                    loss = loss_function(recon, data, mu, logvar, beta)
                    loss.backward()
                    total += loss.item()
                    optimizer.step()
                return total

            def run(model):
                optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
            """,
            """
            import torch
            import flax.nnx as nnx

            @nnx.jit
            def train_step(model, optimizer, data, beta):
                def loss_fn(model):
                    recon, mu, logvar = model(data)
                    loss = loss_function(recon, data, mu, logvar, beta)
                    return loss
                loss, grads = nnx.value_and_grad(loss_fn)(model)
                optimizer.update(model, grads)
                return loss

            def vae_epoch(model, optimizer, loader, beta):
                total = 0.0
                for data, _ in loader:
                    loss = train_step(model, optimizer, data, beta)
                    total += loss.item()
                return total

            def run(model):
                optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
            """,
            title="a loss of several model outputs (a VAE); a host read between backward() and step() runs after the step",
        ),
        Example(
            """
            import torch
            import torch.nn as nn

            class Trainer:
                def __init__(self, model, args):
                    self.model = model
                    self.args = args
                    self.criterion = nn.CrossEntropyLoss()
                    self.optimizer = torch.optim.Adam(self.model.parameters(), lr=args.lr)

                def train_epoch(self, loader):
                    self.model.train()
                    for x, y in loader:
                        self.optimizer.zero_grad()
                        loss = self.criterion(self.model(x), y)
                        loss.backward()
                        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.args.clip)
                        self.optimizer.step()
            """,
            """
            import torch
            import torch.nn as nn
            import optax
            import flax.nnx as nnx

            @nnx.jit(static_argnames=("criterion", "clip"))
            def train_step(model, optimizer, x, y, criterion, clip):
                def loss_fn(model):
                    loss = criterion(model(x), y)
                    return loss
                loss, grads = nnx.value_and_grad(loss_fn)(model)
                grads, _ = optax.clip_by_global_norm(clip).update(grads, optax.EmptyState())
                optimizer.update(model, grads)
                return loss

            class Trainer:
                def __init__(self, model, args):
                    self.model = model
                    self.args = args
                    self.criterion = nn.CrossEntropyLoss()
                    self.optimizer = torch.optim.Adam(self.model.parameters(), lr=args.lr)

                def train_epoch(self, loader):
                    self.model.train()
                    for x, y in loader:
                        loss = train_step(self.model, self.optimizer, x, y, self.criterion, self.args.clip)
            """,
            title="a trainer method: self.model, self.optimizer, self.criterion, self.args.clip",
        ),
        Example(
            """
            import torch

            def fit(model, optimizer, loader):
                for x, y in loader:
                    optimizer.zero_grad()
                    loss = (model(x) - y).pow(2).mean()
                    loss.backward()
                    for p in model.parameters():
                        p.grad.mul_(0.5)
                    optimizer.step()

            def run(model):
                optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            """,
            """
            import torch

            def fit(model, optimizer, loader):
                # porter: manual (JX301): `for p in model.parameters(): p.grad.mul_(0.5)` runs between loss.backward() and optimizer.step()
                for x, y in loader:
                    optimizer.zero_grad()
                    loss = (model(x) - y).pow(2).mean()
                    loss.backward()
                    for p in model.parameters():
                        p.grad.mul_(0.5)
                    optimizer.step()

            def run(model):
                optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            """,
            title="gradients edited between backward() and step(): marked `# porter: manual` and reported",
        ),
        Example(
            """
            import torch
            import torch.nn as nn

            criterion = nn.BCELoss()
            optD = torch.optim.Adam(netD.parameters())
            optG = torch.optim.Adam(netG.parameters())
            for real, _ in loader:
                noise = torch.randn(real.shape[0], 16)
                fake = netG(noise)
                optD.zero_grad()
                lossD = criterion(netD(real), ones) + criterion(netD(fake.detach()), zeros)
                lossD.backward()
                optD.step()
                optG.zero_grad()
                lossG = criterion(netD(fake), ones)
                lossG.backward()
                optG.step()
                print(lossD.item(), lossG.item())
            """,
            """
            import torch
            import torch.nn as nn
            import flax.nnx as nnx

            criterion = nn.BCELoss()
            optD = torch.optim.Adam(netD.parameters())
            optG = torch.optim.Adam(netG.parameters())
            @nnx.jit
            def train_step_optD(netD, optD, netG, noise, real):
                def loss_fn(netD, netG):
                    fake = netG(noise)
                    lossD = criterion(netD(real), ones) + criterion(netD(fake.detach()), zeros)
                    return lossD
                lossD, grads = nnx.value_and_grad(loss_fn)(netD, netG)
                optD.update(netD, grads)
                return lossD

            @nnx.jit
            def train_step_optG(netG, optG, noise, netD):
                def loss_fn(netG, netD):
                    fake = netG(noise)
                    lossG = criterion(netD(fake), ones)
                    return lossG
                lossG, grads = nnx.value_and_grad(loss_fn)(netG, netD)
                optG.update(netG, grads)
                return lossG

            for real, _ in loader:
                noise = torch.randn(real.shape[0], 16)
                lossD = train_step_optD(netD, optD, netG, noise, real)
                lossG = train_step_optG(netG, optG, noise, netD)
                print(lossD.item(), lossG.item())
            """,
            unsafe=True,
            title="two optimizers (a GAN at module level): one step each; the generator's output is computed again in its own step; "
                  "the other model is an argument of the differentiated function (its BatchNorm statistics update), not differentiated",
        ),
        Example(
            """
            import torch

            d_opt = torch.optim.Adam(D.parameters())
            g_opt = torch.optim.Adam(G.parameters())

            def reset_grad():
                d_opt.zero_grad()
                g_opt.zero_grad()

            for x in loader:
                scores = D(x)
                real_score = scores
                scores = D(G(z))
                d_loss = bce(real_score, ones) + bce(scores, zeros)
                reset_grad()
                d_loss.backward()
                d_opt.step()
                print(real_score.mean().item(), scores.mean().item())
            """,
            """
            import torch
            import flax.nnx as nnx

            d_opt = torch.optim.Adam(D.parameters())
            g_opt = torch.optim.Adam(G.parameters())

            def reset_grad():
                d_opt.zero_grad()
                g_opt.zero_grad()

            @nnx.jit
            def train_step(D, d_opt, x, G):
                def loss_fn(D, G):
                    scores = D(x)
                    real_score = scores
                    scores = D(G(z))
                    d_loss = bce(real_score, ones) + bce(scores, zeros)
                    return d_loss, (scores, real_score)
                (d_loss, (scores, real_score)), grads = nnx.value_and_grad(loss_fn, has_aux=True)(D, G)
                d_opt.update(D, grads)
                return d_loss, scores, real_score

            for x in loader:
                d_loss, scores, real_score = train_step(D, d_opt, x, G)
                print(real_score.mean().item(), scores.mean().item())
            """,
            title="a helper that only zeroes gradients is the step's zero_grad(); a copy of a forward value that the "
                  "forward pass then rebinds (`real_score = scores`) is taken inside the step and returned",
        ),
        Example(
            """
            import torch


            def train(args, model, loader, ce, bce):
                optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
                for x, y in loader:
                    optimizer.zero_grad()
                    out = model(x)
                    if args.loss == "ce":
                        loss = ce(out, y)
                    else:
                        loss = bce(out, y)
                    loss.backward()
                    optimizer.step()
            """,
            """
            import torch
            import flax.nnx as nnx


            @nnx.jit(static_argnames=("args_loss", "ce", "bce"))
            def train_step(model, optimizer, x, y, args_loss, ce, bce):
                def loss_fn(model):
                    out = model(x)
                    if args_loss == "ce":
                        loss = ce(out, y)
                    else:
                        loss = bce(out, y)
                    return loss
                loss, grads = nnx.value_and_grad(loss_fn)(model)
                optimizer.update(model, grads)
                return loss


            def train(args, model, loader, ce, bce):
                optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
                for x, y in loader:
                    loss = train_step(model, optimizer, x, y, args.loss, ce, bce)
            """,
            title="a loss chosen by an if on the settings: the branch moves into the step, its test's names static",
        ),
        Example(
            """
            import torch
            import torch.nn as nn

            x = torch.randn(10, 3)
            y = torch.randn(10, 2)
            linear = nn.Linear(3, 2)
            criterion = nn.MSELoss()
            optimizer = torch.optim.SGD(linear.parameters(), lr=0.01)

            pred = linear(x)
            loss = criterion(pred, y)
            print('loss: ', loss.item())
            loss.backward()
            print('dL/dw: ', linear.weight.grad)
            optimizer.step()
            """,
            """
            import torch
            import torch.nn as nn
            import flax.nnx as nnx

            x = torch.randn(10, 3)
            y = torch.randn(10, 2)
            linear = nn.Linear(3, 2)
            criterion = nn.MSELoss()
            optimizer = torch.optim.SGD(linear.parameters(), lr=0.01)

            @nnx.jit
            def train_step(linear, optimizer):
                def loss_fn(linear):
                    pred = linear(x)
                    loss = criterion(pred, y)
                    return loss
                loss, grads = nnx.value_and_grad(loss_fn)(linear)
                optimizer.update(linear, grads)
                return loss, grads

            loss, grads = train_step(linear, optimizer)
            print('loss: ', loss.item())
            print('dL/dw: ', grads["kernel"][...].T)
            """,
            title="one step outside a loop (a tutorial's): the layer's weight.grad read from the step's gradients",
        ),
        Example(
            """
            import torch

            def train(model, loader, accum_steps, clip):
                optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
                batches = iter(loader)
                for it in range(100):
                    for micro_step in range(accum_steps):
                        x, y = next(batches)
                        loss = torch.nn.functional.mse_loss(model(x), y)
                        loss = loss / accum_steps
                        loss.backward()
                    if clip != 0.0:
                        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                    print(it, loss.item())
            """,
            """
            import torch
            import jax
            import optax
            import flax.nnx as nnx
            import jax.numpy as jnp

            @nnx.jit
            def grad_step(model, x, y, accum_steps):
                def loss_fn(model):
                    loss = torch.nn.functional.mse_loss(model(x), y)
                    loss = loss / accum_steps
                    return loss
                loss, grads = nnx.value_and_grad(loss_fn)(model)
                return loss, grads

            @nnx.jit(static_argnames=("clip",))
            def update_step(model, optimizer, grads, clip):
                if clip != 0.0:
                    norm = optax.global_norm(grads)
                    grads = jax.tree.map(lambda g: g * jnp.minimum(clip / (norm + 1e-6), 1.0), grads)
                optimizer.update(model, grads)

            def train(model, loader, accum_steps, clip):
                optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
                batches = iter(loader)
                for it in range(100):
                    grads = None
                    for micro_step in range(accum_steps):
                        x, y = next(batches)
                        loss, micro_grads = grad_step(model, x, y, accum_steps)
                        grads = micro_grads if grads is None else jax.tree.map(jnp.add, grads, micro_grads)
                    update_step(model, optimizer, grads, clip)
                    print(it, loss.item())
            """,
            title="a loop of micro-steps (gradient accumulation): a gradient step per micro-batch, the gradients summed, one update step with torch's clip_grad_norm_ (coefficient max_norm / (norm + 1e-6), at most 1)",
        ),
        Example(
            """
            import torch

            def train(model, loader, accum):
                optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
                for i, (x, y) in enumerate(loader):
                    loss = torch.nn.functional.mse_loss(model(x), y) / accum
                    loss.backward()
                    if (i + 1) % accum == 0:
                        optimizer.step()
                        optimizer.zero_grad()
            """,
            """
            import torch
            import jax
            import flax.nnx as nnx
            import jax.numpy as jnp

            @nnx.jit
            def grad_step(model, x, y, accum):
                def loss_fn(model):
                    loss = torch.nn.functional.mse_loss(model(x), y) / accum
                    return loss
                loss, grads = nnx.value_and_grad(loss_fn)(model)
                return loss, grads

            @nnx.jit
            def update_step(model, optimizer, grads):
                optimizer.update(model, grads)

            def train(model, loader, accum):
                optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
                grads = None
                for i, (x, y) in enumerate(loader):
                    loss, micro_grads = grad_step(model, x, y, accum)
                    grads = micro_grads if grads is None else jax.tree.map(jnp.add, grads, micro_grads)
                    if (i + 1) % accum == 0:
                        update_step(model, optimizer, grads)
                        grads = None
            """,
            title='the step every `accum` iterations of one loop: the gradients summed until the `if` applies them',
        ),
        Example(
            """
            import torch
            import torch.nn as nn

            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.fc = nn.Linear(4, 2)

                def configure_optimizers(self, lr):
                    decay = [p for n, p in self.named_parameters() if p.dim() >= 2]
                    rest = [p for n, p in self.named_parameters() if p.dim() < 2]
                    groups = [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}]
                    optimizer = torch.optim.AdamW(groups, lr=lr)
                    return optimizer

            model = Net()
            optimizer = model.configure_optimizers(1e-3)
            X, Y = get_batch()
            for k in range(10):
                logits = model(X)
                loss = ((logits - Y) ** 2).mean()
                X, Y = get_batch()
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                print(loss.item())
            """,
            """
            import torch
            import torch.nn as nn
            import flax.nnx as nnx

            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.fc = nn.Linear(4, 2)

                def configure_optimizers(self, lr):
                    decay = [p for n, p in self.named_parameters() if p.dim() >= 2]
                    rest = [p for n, p in self.named_parameters() if p.dim() < 2]
                    groups = [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}]
                    optimizer = torch.optim.AdamW(groups, lr=lr)
                    return optimizer

            model = Net()
            optimizer = model.configure_optimizers(1e-3)
            X, Y = get_batch()
            @nnx.jit
            def train_step(model, optimizer, X, Y):
                def loss_fn(model):
                    logits = model(X)
                    loss = ((logits - Y) ** 2).mean()
                    return loss
                loss, grads = nnx.value_and_grad(loss_fn)(model)
                optimizer.update(model, grads)
                return loss

            for k in range(10):
                loss = train_step(model, optimizer, X, Y)
                X, Y = get_batch()
                print(loss.item())
            """,
            title="an optimizer made by a method of the model's class from its parameter groups (nanoGPT's configure_optimizers); the next batch fetched between the forward pass and backward() is fetched after the step call",
        ),
        Example(
            """
            import torch

            def make_optimizer(net, lr):
                return torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)

            def fit(model, loader):
                opt = make_optimizer(model, 0.01)
                for x, y in loader:
                    opt.zero_grad()
                    loss = (model(x) - y).pow(2).mean()
                    loss.backward()
                    opt.step()
            """,
            """
            import torch
            import flax.nnx as nnx

            def make_optimizer(net, lr):
                return torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)

            @nnx.jit
            def train_step(model, opt, x, y):
                def loss_fn(model):
                    loss = (model(x) - y).pow(2).mean()
                    return loss
                loss, grads = nnx.value_and_grad(loss_fn)(model)
                opt.update(model, grads)
                return loss

            def fit(model, loader):
                opt = make_optimizer(model, 0.01)
                for x, y in loader:
                    loss = train_step(model, opt, x, y)
            """,
            title='an optimizer made by a function of the program given the model',
        ),
        Example(
            """
            import torch

            model = Net()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            if profile:
                for k in range(5):
                    loss = criterion(model(x), y)
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                    prof.step()
            else:
                for stage, steps in enumerate([10, 20]):
                    for k in range(steps):
                        loss = criterion(model(x), y)
                        optimizer.zero_grad()
                        loss.backward()
                        optimizer.step()
            """,
            """
            import torch
            import flax.nnx as nnx

            model = Net()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            @nnx.jit
            def train_step(model, optimizer):
                def loss_fn(model):
                    loss = criterion(model(x), y)
                    return loss
                loss, grads = nnx.value_and_grad(loss_fn)(model)
                optimizer.update(model, grads)
                return loss

            if profile:
                for k in range(5):
                    loss = train_step(model, optimizer)
                    prof.step()
            else:
                for stage, steps in enumerate([10, 20]):
                    for k in range(steps):
                        loss = train_step(model, optimizer)
            """,
            title="two loops stepping the same model and optimizer (a profiled run and a timed one): one step function, called by both",
        ),
        Example(
            """
            import torch

            def fit(model, loader, accum):
                opt = torch.optim.SGD(model.parameters(), lr=0.01)
                it = iter(loader)
                for step in range(10):
                    for micro in range(accum):
                        x, y = next(it)
                        loss = (model(x) - y).pow(2).mean()
                        loss.backward()
                    opt.step()
            """,
            """
            import torch

            def fit(model, loader, accum):
                opt = torch.optim.SGD(model.parameters(), lr=0.01)
                it = iter(loader)
                # porter: manual (JX301): gradient accumulation: opt's gradients are not zeroed in the loop: they accumulate across optimizer steps
                for step in range(10):
                    for micro in range(accum):
                        x, y = next(it)
                        loss = (model(x) - y).pow(2).mean()
                        loss.backward()
                    opt.step()
            """,
            title='micro-steps whose gradients are never zeroed: marked `# porter: manual` and reported at the loop',
        ),
        Example(
            """
            import torch
            import torch.nn as nn

            netG = nn.Sequential(nn.Linear(8, 16), nn.Tanh())
            netD = nn.Sequential(nn.Linear(16, 1), nn.Sigmoid())
            optD = torch.optim.Adam(netD.parameters(), lr=2e-4)
            optG = torch.optim.Adam(netG.parameters(), lr=2e-4)
            criterion = nn.BCELoss()

            def train_gan(loader):
                for real in loader:
                    netD.zero_grad()
                    label = torch.ones(real.shape[0])
                    out = netD(real)
                    err_real = criterion(out, label)
                    err_real.backward()
                    d_x = out.mean().item()
                    noise = torch.randn(real.shape[0], 8)
                    fake = netG(noise)
                    label.fill_(0.0)
                    out = netD(fake.detach())
                    err_fake = criterion(out, label)
                    err_fake.backward()
                    optD.step()
                    netG.zero_grad()
                    label.fill_(1.0)
                    err_g = criterion(netD(fake), label)
                    err_g.backward()
                    optG.step()
                    print(d_x, err_real.item() + err_fake.item(), err_g.item())
            """,
            """
            import torch
            import torch.nn as nn
            import flax.nnx as nnx

            netG = nn.Sequential(nn.Linear(8, 16), nn.Tanh())
            netD = nn.Sequential(nn.Linear(16, 1), nn.Sigmoid())
            optD = torch.optim.Adam(netD.parameters(), lr=2e-4)
            optG = torch.optim.Adam(netG.parameters(), lr=2e-4)
            criterion = nn.BCELoss()

            @nnx.jit
            def train_step_optD(netD, optD, real, label, netG, noise):
                def loss_fn(netD, label, netG):
                    out = netD(real)
                    out_1 = out
                    err_real = criterion(out, label)
                    fake = netG(noise)
                    label.fill_(0.0)
                    out = netD(fake.detach())
                    err_fake = criterion(out, label)
                    return err_real + err_fake, (out_1, err_real, label, err_fake)
                (loss, (out_1, err_real, label, err_fake)), grads = nnx.value_and_grad(loss_fn, has_aux=True)(netD, label, netG)
                optD.update(netD, grads)
                return loss, out_1, err_real, label, err_fake

            @nnx.jit
            def train_step_optG(netG, optG, noise, netD, label):
                def loss_fn(netG, netD):
                    fake = netG(noise)
                    err_g = criterion(netD(fake), label)
                    return err_g
                err_g, grads = nnx.value_and_grad(loss_fn)(netG, netD)
                optG.update(netG, grads)
                return err_g

            def train_gan(loader):
                for real in loader:
                    label = torch.ones(real.shape[0])
                    noise = torch.randn(real.shape[0], 8)
                    loss, out_1, err_real, label, err_fake = train_step_optD(netD, optD, real, label, netG, noise)
                    d_x = out_1.mean().item()
                    label.fill_(1.0)
                    err_g = train_step_optG(netG, optG, noise, netD, label)
                    print(d_x, err_real.item() + err_fake.item(), err_g.item())
            """,
            title="a GAN's discriminator step of two forward passes reusing their names (the label relabelled in place, the first output read on the host): one step; the generator's pass is computed again in its own step, exact for a model of the file without BatchNorm, dropout or draws",
        ),
    ]
    valid = [
        "import torch\nfor x in loader:\n    with torch.no_grad():\n        out = model(x)\n",
        "import torch\ndef f(loss):\n    loss.backward()\n",
    ]

    def visit_For(self, node: cst.For) -> None:
        self._loop(node)

    def visit_While(self, node: cst.While) -> None:
        self._loop(node)

    def visit_Module(self, node: cst.Module) -> None:
        self._straight(list(node.body), None)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        if isinstance(node.body, cst.IndentedBlock):
            self._straight(list(node.body.body), node)

    # ----------------------------------------------------------------------------------
    def _straight(self, stmts: list, fn) -> None:
        """One training step written out in a block, not in a loop (a tutorial's single
        step): the statements from the first of its forward pass to `optimizer.step()` are
        analysed as a loop body would be, and replaced by the step's definition and call."""
        if not lp.imports_torch(self.ctx):
            return
        originals = stmts
        # in a method (a trainer's `_run_batch`), `self.model` etc. are analysed as plain names
        # and put back in the code that stays, as for a loop
        aliases = lp.self_aliases(cst.IndentedBlock(list(stmts)), fn)
        if aliases:
            stmts = [s.visit(lp.ToNames(aliases)) for s in stmts]
        pieces = [lp.classify(s, self.ctx, aliases) for s in stmts]
        end = next((k for k, p in enumerate(pieces) if p.kind == "step"), None)
        if end is None:
            return
        backs = [k for k in range(end) if pieces[k].kind == "backward"]
        if not backs:
            return
        facts = lp.file_facts(self.ctx)
        opt = lp.code(pieces[end].receiver)
        model = facts.optimizers.get(aliases.get(opt, opt))
        model = {v: k for k, v in aliases.items()}.get(model, model) if model else model
        if not model:
            self.report(originals[end], f"training step not rewritten: the model {opt} optimizes is not known here "
                                        "(built from a model's parameters in this file, it is)", severity=Severity.ERROR)
            return
        models = facts.modules | {model} | {k for k, v in aliases.items() if v in facts.modules}
        last = backs[-1]
        domain = list(stmts[:last])
        loss_reads = set(lp.reads(pieces[last].receiver))
        forward = lp._backward_slice(domain, loss_reads) & lp._model_dependent(domain, models, self.ctx)
        if not forward:
            self.report(originals[end], f"training step not rewritten: the loss of this backward() does not depend on "
                                        f"the model {model}", severity=Severity.ERROR)
            return
        start = min(k for k, s in enumerate(domain) if id(s) in forward)
        while start > 0 and pieces[start - 1].kind == "zero_grad":  # optimizer.zero_grad() first
            start -= 1
        # the window must not hold what builds the model or the optimizer, nor another
        # backward (plain tensors' autograd before the step: JX313's)
        window = list(stmts[start:end + 1])
        if any(lp.binds(s) & {model, opt} for s in window):
            return
        if any(pieces[k].kind == "backward" and not (set(lp.reads(pieces[k].receiver)) & lp.bound_in(window[:k - start]))
               for k in range(start, end)):
            return
        gname = None
        grad_edits: dict[int, cst.BaseStatement] = {}
        try:
            for k in range(last + 1, end):
                grad_reads = [n for n in astutil.walk(stmts[k], into_functions=True)
                              if isinstance(n, cst.Attribute) and n.attr.value == "grad"]
                if not grad_reads:
                    continue
                if gname is None:
                    gname = _fresh("grads", set(lp.reads(self.ctx.module)) | facts.toplevel)
                grad_edits[k] = stmts[k].visit(_GradReads(self.ctx, model, gname))
            if grad_edits:
                window = [grad_edits.get(start + j, s) for j, s in enumerate(window)]
            window[0] = window[0].with_changes(leading_lines=[])  # its comments go above the definition
            fake = cst.While(test=cst.Name("True"), body=cst.IndentedBlock(window))
            later = set()
            for s in stmts[end + 1:]:
                later.update(lp.reads(s))
            plan = lp.plan_steps(fake, self.ctx, later, aliases)
            if len(plan.regions) != 1:
                return
            text, call = self._build(plan.regions[0], fn, fake, False, aliases or None, gname)
        except lp.Unsupported as exc:
            self.report(originals[end], f"training step not rewritten: {exc}", severity=Severity.ERROR)
            return
        region = plan.regions[0]
        part = [*region.before, call, *region.after, *plan.tail]
        if aliases:  # the code that stays in the method reads the attributes again
            part = [s.visit(lp.ToAttributes(aliases)) for s in part]
            call = part[len(region.before)]
        comments = [line for d in region.dropped for line in d.leading_lines if line.comment is not None]
        lead = list(stmts[start].leading_lines)  # the window's first statement's comments
        defs = list(cst.parse_module(text).body)
        at = next(k for k, s in enumerate(part) if s is call)
        part[at] = call.with_changes(leading_lines=[*call.leading_lines, *comments])
        if fn is None:  # a script's top level: the definition where the step was
            defs[0] = defs[0].with_changes(leading_lines=lead)
            part[0] = part[0].with_changes(leading_lines=[cst.EmptyLine(), *part[0].leading_lines])
        else:  # in a function: a module-level step, before the statement holding it
            part[0] = part[0].with_changes(leading_lines=[*lead, *part[0].leading_lines])
        if fn is None:
            edits = [self.replace(originals[start], cst.FlattenSentinel([*defs, *part]))]
        else:
            edits = [self.replace(originals[start], cst.FlattenSentinel(part))]
            holder = self.ctx.ancestors[1] if len(self.ctx.ancestors) > 1 else fn
            edits.append(self.replace(holder, _insert_defs_before(defs)))
        stop = end + 1
        while (stop < len(pieces) and pieces[stop].kind == "zero_grad"  # `step(); zero_grad()`: zeroed after
               and lp.code(pieces[stop].receiver) in (opt, model)):
            stop += 1
        edits += [self.remove(s) for s in originals[start + 1:stop]]
        message = (f"PyTorch training step (backward/step) outside a loop: rewrite as {call_name(call)} "
                   "(@nnx.jit, nnx.value_and_grad, optimizer.update)")
        imports = ("flax.nnx",) + (("optax",) if region.clips else ())
        self.report(originals[end], message, Fix(tuple(edits), Safety.SAFE, imports))

    # ----------------------------------------------------------------------------------
    def _loop(self, loop) -> None:
        if not isinstance(loop.body, cst.IndentedBlock) or not lp.imports_torch(self.ctx):
            return
        top = [lp.classify(s, self.ctx) for s in loop.body.body]
        if self._accumulation(loop, top):
            return
        if not any(p.kind == "backward" for p in top) and not any(
            p.kind == "other" and _backward_outside_loops(p.stmt) for p in top
        ):
            return
        if lp.phase_test(loop, self.ctx) is not None:
            return  # a loop that trains in one phase only: JX321 splits it first
        if not any(p.kind == "step" for p in top) and not any(
            astutil.method_name(c) == "step" for c in astutil.calls_in(loop.body)
        ):
            return
        fn = self.ctx.enclosing(cst.FunctionDef)
        scope = fn if fn is not None else self.ctx.module
        original = loop
        aliases = lp.self_aliases(loop, fn)
        if aliases:  # a trainer method: analyse `self.model` etc. as plain names
            loop = loop.visit(lp.ToNames(aliases))
        try:
            plan = lp.plan_steps(loop, self.ctx, self._later_reads(scope, original), aliases)
            built = [self._build(region, fn, loop, len(plan.regions) > 1, aliases, reuse=True) for region in plan.regions]
        except lp.Unsupported as exc:
            self._manual(original, str(exc))
            return
        defs, calls = [], []
        for region, (text, call) in zip(plan.regions, built):
            if text:
                defs.append(text)
            calls.append(call)
        new_body: list[cst.BaseStatement] = []
        for region, call in zip(plan.regions, calls):
            part = [*region.before, call, *region.after]
            # the comments of the statements the step replaces go above the call
            comments = [line for d in region.dropped for line in d.leading_lines if line.comment is not None]
            at = part.index(call)
            lead = list(call.leading_lines)
            if region.first is not None and any(region.first is d for d in region.dropped):
                lead = list(region.first.leading_lines)
                comments = [c for c in comments if not any(c is x for x in lead)]
                at = 0
                if part[0] is not call:
                    part[0] = part[0].with_changes(leading_lines=lead)
                    lead, at = list(call.leading_lines), part.index(call)
            part[at] = call.with_changes(leading_lines=[*lead, *comments])
            new_body.extend(part)
        new_body.extend(plan.tail)
        if aliases:  # the code that stays in the method reads the attributes again
            new_body = [s.visit(lp.ToAttributes(aliases)) for s in new_body]
        def_nodes = []
        for i, text in enumerate(defs):
            node = cst.parse_module(text).body[0]
            def_nodes.append(node)
        # one blank line after each step definition; the definitions go before the top-level
        # statement holding the loop
        holder = self.ctx.ancestors[1] if len(self.ctx.ancestors) > 1 else loop
        holders = self.ctx.cache.setdefault(("jx.step_holders",), set())
        # another step of this pass goes before the same top-level statement (a script's
        # second loop over the model): the edits of one node do not compose, so this one is
        # reported without its fix and made next pass, where it may call the step defined now
        later = bool(def_nodes) and id(holder) in holders
        if def_nodes:
            holders.add(id(holder))
        nnx = lp.nnx_name(self.ctx)
        optax_needed = any(r.clips for r in plan.regions)
        imports = ("flax.nnx",) + (("optax",) if optax_needed else ())
        del nnx
        # a mark an earlier pass left (the optimizer was not ported yet) goes with the rewrite
        lead = [line for line in original.leading_lines
                if line.comment is None or f"{MANUAL} (JX301)" not in line.comment.value]
        edits = [
            self.replace(original, original.with_changes(body=original.body.with_changes(body=new_body), leading_lines=lead))
            if len(lead) != len(original.leading_lines) else
            self.replace(original.body, original.body.with_changes(body=new_body)),
        ]
        if def_nodes:
            edits.append(self.replace(holder, _insert_defs_before(def_nodes)))
        names = ", ".join(call_name(c) for c in calls)
        unsafe = any(not lp.recompute_exact(s, self.ctx, frozenset(r.model for r in plan.regions[:k] if r.model))
                     for k, region in enumerate(plan.regions) for s in region.recomputed)
        message = f"PyTorch training step (backward/step): rewrite as {names} (@nnx.jit, nnx.value_and_grad, optimizer.update)"
        if unsafe:
            message += "; the forward statements " + ", ".join(
                f"`{lp.code(s).strip()}`" for r in plan.regions for s in r.recomputed
            ) + " are computed again in a later step"
        self.report(loop, message, None if later else Fix(tuple(edits), Safety.UNSAFE if unsafe else Safety.SAFE, imports))

    # ----------------------------------------------------------------------------------
    # Gradient accumulation: several backward() calls per optimizer step
    # ----------------------------------------------------------------------------------
    def _accumulation(self, loop, top) -> bool:
        """A loop that accumulates gradients: an inner loop of micro-steps with the backward
        pass, followed by the step (nested), or a backward pass every iteration and the step
        under an `if` (every `accum` iterations). Rewritten (or marked) here: True."""
        stmts = list(loop.body.body)
        nested = [k for k, p in enumerate(top) if p.kind == "other" and isinstance(p.stmt, (cst.For, cst.While))
                  and lp.has_backward(p.stmt)]
        steps_at_top = [k for k, p in enumerate(top) if p.kind == "step"]
        backs_at_top = [k for k, p in enumerate(top) if p.kind == "backward"]
        optimizers = lp.file_facts(self.ctx).optimizers

        def steps_in(node) -> bool:  # an optimizer porter knows steps in ``node``
            return any(astutil.method_name(c) == "step" and not c.args and lp.code(c.func.value) in optimizers
                       for c in astutil.calls_in(node))

        if nested and not backs_at_top:
            # the micro-steps only take gradients (an epoch loop around a whole training loop,
            # then `scheduler.step()`, is no accumulation); a known optimizer steps after them
            if steps_in(stmts[nested[0]]) or not any(k > nested[0] for k in steps_at_top):
                return False
            form = "nested"
        elif backs_at_top and not steps_at_top:
            gated = [k for k, p in enumerate(top) if k > backs_at_top[-1] and isinstance(p.stmt, cst.If)
                     and isinstance(p.stmt.body, cst.IndentedBlock)
                     and any(lp.classify(s, self.ctx).kind == "step" for s in p.stmt.body.body)]
            if not gated:
                return False
            form = "gated"
        else:
            return False
        if not lp.imports_torch(self.ctx):
            return False
        fn = self.ctx.enclosing(cst.FunctionDef)
        scope = fn if fn is not None else self.ctx.module
        original = loop
        aliases = lp.self_aliases(loop, fn)
        if aliases:
            loop = loop.visit(lp.ToNames(aliases))
            stmts = list(loop.body.body)
        try:
            if form == "nested":
                new_body, defs, imports, lead_stmt = self._nested_accumulation(loop, stmts, nested[0], fn, scope, original, aliases)
            else:
                new_body, defs, imports, lead_stmt = self._gated_accumulation(loop, stmts, gated[0], fn, scope, original, aliases)
        except lp.Unsupported as exc:
            self._manual(original, f"gradient accumulation: {exc}")
            return True
        if aliases:
            new_body = [s.visit(lp.ToAttributes(aliases)) for s in new_body]
            if lead_stmt is not None:
                lead_stmt = lead_stmt.visit(lp.ToAttributes(aliases))
        def_nodes = [cst.parse_module(text).body[0] for text in defs]
        holder = self.ctx.ancestors[1] if len(self.ctx.ancestors) > 1 else loop
        lead = [line for line in original.leading_lines
                if line.comment is None or f"{MANUAL} (JX301)" not in line.comment.value]
        edits = [self.replace(original.body, original.body.with_changes(body=new_body))]

        def before_loop(updated, init=lead_stmt):
            # `grads = None` before the loop takes the loop's comments
            updated = updated.with_changes(leading_lines=lead)
            if init is None:
                return updated
            return cst.FlattenSentinel([init.with_changes(leading_lines=updated.leading_lines),
                                        updated.with_changes(leading_lines=[])])

        if holder is original:
            def both(updated):
                placed = before_loop(updated)
                nodes = list(placed.nodes) if isinstance(placed, cst.FlattenSentinel) else [placed]
                first = _insert_defs_before(def_nodes)(nodes[0])
                return cst.FlattenSentinel([*first.nodes, *nodes[1:]])
            edits.append(self.replace(original, both))
        else:
            if lead_stmt is not None or len(lead) != len(original.leading_lines):
                edits.append(self.replace(original, before_loop))
            edits.append(self.replace(holder, _insert_defs_before(def_nodes)))
        names = ", ".join(d.name.value for d in def_nodes)
        message = (f"PyTorch training step with gradient accumulation: rewrite as {names} (@nnx.jit: "
                   "nnx.value_and_grad per micro-step, gradients summed, optimizer.update once)")
        self.report(original, message, Fix(tuple(edits), Safety.SAFE, imports))
        return True

    def _micro_region(self, micro: list, step_stmt, fn, scope, original, later_extra, aliases, what: str):
        """The gradient step of one micro-batch: ``micro`` analysed as a loop body ending in
        ``step_stmt``; (region, definition, call, gradients name)."""
        body = [s for s in micro if lp.classify(s, self.ctx, aliases).kind != "zero_grad"]
        for s in body:
            piece = lp.classify(s, self.ctx, aliases)
            if piece.kind in ("step", "clip"):
                raise lp.Unsupported(f"`{lp.code(s).strip()}` inside the {what}")
        fake = cst.While(test=cst.Name("True"), body=cst.IndentedBlock([*body, step_stmt]))
        later = self._later_reads(scope, original) | later_extra
        plan = lp.plan_steps(fake, self.ctx, later, aliases)
        if len(plan.regions) != 1 or plan.tail:
            raise lp.Unsupported(f"the {what} is not one forward and backward pass")
        region = plan.regions[0]
        facts = lp.file_facts(self.ctx)
        taken = set(lp.reads(self.ctx.module)) | facts.toplevel | lp.bound_in(micro)
        micro_grads = _fresh("micro_grads", taken)
        text, call = self._build(region, fn, fake, False, aliases or None, micro_grads, update=False)
        return region, text, call, micro_grads

    def _update_step(self, model: str, opt: str, grads: str, clips: list, fn, several: bool) -> tuple[str, cst.BaseStatement]:
        """The update step: torch's clipping of the summed gradients (``clips``: clip
        statements, or `if`s holding only them) and ``opt.update``."""
        ctx = self.ctx
        facts = lp.file_facts(ctx)
        nnx = lp.nnx_name(ctx)
        jax, jnp, optax = ctx.module_alias("jax"), ctx.module_alias("jax.numpy"), ctx.module_alias("optax")
        if fn is not None:
            local = lp.function_locals(fn)
        else:
            local = set()
            for anc in ctx.ancestors:
                if isinstance(anc, (cst.For, cst.While)):
                    local |= _module_assigned(anc)
        exprs: list = []
        rendered: list = []  # (indent, kind, limit expression, test expression or None)
        for stmt in clips:
            test = None
            inner = [stmt]
            if isinstance(stmt, cst.If):
                if stmt.orelse is not None:
                    raise lp.Unsupported(f"`{lp.code(stmt).strip().splitlines()[0]}` has an else branch around the clipping")
                test = stmt.test
                inner = list(stmt.body.body)
                exprs.append(test)
            for s in inner:
                piece = lp.classify(s, ctx)
                if piece.kind != "clip":
                    raise lp.Unsupported(f"`{lp.code(s).strip()}` runs between the backward passes and optimizer.step()")
                kind = lp._CLIP[ctx.qualname(piece.call.func) or ""]
                params_arg = astutil.arg(piece.call, "parameters", 0)
                if params_arg is None or lp.code(params_arg.value).replace(" ", "") != f"{model}.parameters()":
                    raise lp.Unsupported(f"`{lp.code(s).strip()}` clips other parameters than {model}'s")
                limit = astutil.arg(piece.call, "max_norm" if kind == "norm" else "clip_value", 1)
                other = [a for a in piece.call.args[2:] if a.keyword is None or a.keyword.value != "max_norm"]
                if limit is None or (kind == "norm" and other):
                    raise lp.Unsupported(f"`{lp.code(s).strip()}`: only (parameters, max_norm) is translated")
                exprs.append(limit.value)
                rendered.append((test, kind, limit.value))
        static: list[str] = []
        static_values: list[str] = []
        renames: dict[str, str] = {}
        taken = {model, opt, grads, "norm"}
        free: dict[str, None] = {}
        for e in exprs:
            free.update(dict.fromkeys(lp.reads(e)))
        for n in free:
            if n in lp._BUILTINS and n not in local or n in (model, opt):
                continue
            if n in facts.modules:
                raise lp.Unsupported(f"the clipping reads the model {n}")
            if n not in local:
                continue  # a module-level setting: read by the traced function as it is
            if n in facts.namespaces or n in ("args", "cfg", "config", "hparams", "flags", "FLAGS", "opt_args"):
                chains = _attribute_chains(n, exprs)
                if chains is None:
                    raise lp.Unsupported(f"the clipping uses the namespace `{n}` other than through its fields")
                for chain in chains:
                    pname = chain.split(".")[-1]
                    if pname in taken or not pname.isidentifier():
                        pname = chain.replace(".", "_")
                    taken.add(pname)
                    renames[chain] = pname
                    static.append(pname)
                    static_values.append(chain)
                continue
            static.append(n)
            static_values.append(n)
            taken.add(n)
        step = _step_name(ctx, opt, several, "update_step")
        decorator = f"@{nnx}.jit"
        if static:
            decorator += "(static_argnames=(" + ", ".join(f'"{x}"' for x in static) + ("," if len(static) == 1 else "") + "))"
        lines = [decorator, f"def {step}({', '.join([model, opt, grads, *static])}):"]
        for test, kind, limit in rendered:
            pad = "    "
            if test is not None:
                lines.append(f"    if {lp.code(_rename(test, renames))}:")
                pad = "        "
            value = lp.code(_rename(limit, renames))
            if kind == "norm":  # torch: coef = max_norm / (total_norm + 1e-6), clamped to 1
                lines.append(f"{pad}norm = {optax}.global_norm({grads})")
                lines.append(f"{pad}{grads} = {jax}.tree.map(lambda g: g * {jnp}.minimum({value} / (norm + 1e-6), 1.0), {grads})")
            else:
                lines.append(f"{pad}{grads} = {jax}.tree.map(lambda g: {jnp}.clip(g, -({value}), {value}), {grads})")
        lines.append(f"    {opt}.update({model}, {grads})")
        text = "\n".join(lines) + "\n"
        call = cst.parse_statement(f"{step}({', '.join([model, opt, grads, *static_values])})\n")
        return text, call

    def _accumulate_stmt(self, total: str, micro: str) -> cst.BaseStatement:
        jax, jnp = self.ctx.module_alias("jax"), self.ctx.module_alias("jax.numpy")
        return cst.parse_statement(f"{total} = {micro} if {total} is None else {jax}.tree.map({jnp}.add, {total}, {micro})\n")

    def _imports(self, clips) -> tuple:
        has_norm = any(lp._CLIP.get(self.ctx.qualname(c.func) or "") == "norm"
                       for s in clips for c in astutil.calls_in(s))
        return ("flax.nnx", "jax", "jax.numpy") + (("optax",) if has_norm else ())

    def _nested_accumulation(self, loop, stmts, at, fn, scope, original, aliases):
        """`for micro_step in range(n): forward; loss.backward()` then clipping, step(), zero_grad()."""
        inner = stmts[at]
        if not isinstance(inner.body, cst.IndentedBlock) or inner.orelse is not None:
            raise lp.Unsupported("the micro-step loop has an else branch or a one-line body")
        pieces = [lp.classify(s, self.ctx, aliases) for s in stmts]
        after = pieces[at + 1:]
        step_at = next((k for k, p in enumerate(after) if p.kind == "step"), None)
        if step_at is None:
            stepper = next(s for s in stmts[at + 1:] if any(astutil.method_name(c) == "step" for c in astutil.calls_in(s)))
            raise lp.Unsupported(f"`{lp.code(stepper).strip()}` is not the step of an optimizer porter knows")
        step_piece = after[step_at]
        opt = lp.code(step_piece.receiver)
        clips = [p.stmt for p in after[:step_at] if p.kind != "zero_grad"]
        tail = [p for p in after[step_at + 1:]]
        for p in tail:
            if p.kind in ("step", "backward", "clip") or (p.kind == "other" and lp.has_backward(p.stmt)):
                raise lp.Unsupported(f"`{lp.code(p.stmt).strip()}` after optimizer.step()")
        head = pieces[:at]
        for p in head:
            if p.kind in ("step", "backward", "clip"):
                raise lp.Unsupported(f"`{lp.code(p.stmt).strip()}` before the micro-step loop")
        zeroed = [p for p in [*head, *tail] if p.kind == "zero_grad"]
        if not zeroed:
            raise lp.Unsupported(f"{opt}'s gradients are not zeroed in the loop: they accumulate across optimizer steps")
        later_extra: set[str] = set()
        for k, s in enumerate(stmts):
            if k != at:
                later_extra.update(lp.reads(s))
        region, grad_text, grad_call, micro = self._micro_region(
            list(inner.body.body), step_piece.stmt, fn, scope, original, later_extra, aliases, "micro-step loop")
        model = region.model
        facts = lp.file_facts(self.ctx)
        total = _fresh("grads", set(lp.reads(self.ctx.module)) | facts.toplevel | lp.bound_in(stmts) | {micro})
        upd_text, upd_call = self._update_step(model, opt, total, clips, fn, False)
        comments = [line for d in region.dropped if d is not step_piece.stmt
                    for line in d.leading_lines if line.comment is not None]
        grad_call = grad_call.with_changes(leading_lines=comments)
        new_inner = [*region.before, grad_call, self._accumulate_stmt(total, micro), *region.after]
        # the comments of the clipping and the step go above the update call
        upd_comments = [line for s in [*clips, step_piece.stmt] for line in s.leading_lines]
        upd_call = upd_call.with_changes(leading_lines=upd_comments)
        init = cst.parse_statement(f"{total} = None\n")
        new_body = [p.stmt for p in head if p.kind != "zero_grad"]
        new_body += [init.with_changes(leading_lines=inner.leading_lines),
                     inner.with_changes(body=inner.body.with_changes(body=new_inner), leading_lines=[]),
                     upd_call]
        new_body += [p.stmt for p in tail if p.kind != "zero_grad"]
        return new_body, [grad_text, upd_text], self._imports(clips), None

    def _gated_accumulation(self, loop, stmts, at, fn, scope, original, aliases):
        """`forward; loss.backward()` every iteration and `if (i + 1) % accum == 0: step();
        zero_grad()`."""
        gate = stmts[at]
        if gate.orelse is not None or not isinstance(gate.body, cst.IndentedBlock):
            raise lp.Unsupported("the `if` around optimizer.step() has an else branch")
        inside = [lp.classify(s, self.ctx, aliases) for s in gate.body.body]
        step_at = next((k for k, p in enumerate(inside) if p.kind == "step"), None)
        if step_at is None:
            raise lp.Unsupported("the step under the `if` is not the step of an optimizer porter knows")
        step_piece = inside[step_at]
        opt = lp.code(step_piece.receiver)
        clips = [p.stmt for p in inside[:step_at] if p.kind != "zero_grad"]
        rest = inside[step_at + 1:]
        for p in rest:
            if p.kind in ("step", "backward", "clip") or lp.has_backward(p.stmt):
                raise lp.Unsupported(f"`{lp.code(p.stmt).strip()}` after optimizer.step()")
        if not any(p.kind == "zero_grad" for p in rest):
            raise lp.Unsupported(f"{opt}.zero_grad() does not follow the step under the `if`")
        pieces = [lp.classify(s, self.ctx, aliases) for s in stmts]
        if any(p.kind == "zero_grad" for p in pieces):
            raise lp.Unsupported("gradients are also zeroed outside the `if` around optimizer.step()")
        tail = stmts[at + 1:]
        for s in tail:
            if lp.has_backward(s) or any(astutil.method_name(c) == "step" and lp.classify(s, self.ctx, aliases).kind == "step"
                                         for c in astutil.calls_in(s)):
                raise lp.Unsupported(f"`{lp.code(s).strip()}` after the `if` around optimizer.step()")
        later_extra: set[str] = set(lp.reads(gate.test))
        for s in [*tail, *(p.stmt for p in rest)]:
            later_extra.update(lp.reads(s))
        region, grad_text, grad_call, micro = self._micro_region(
            stmts[:at], step_piece.stmt, fn, scope, original, later_extra, aliases, "loop body")
        model = region.model
        facts = lp.file_facts(self.ctx)
        total = _fresh("grads", set(lp.reads(self.ctx.module)) | facts.toplevel | lp.bound_in(stmts) | {micro})
        upd_text, upd_call = self._update_step(model, opt, total, clips, fn, False)
        lead = list(region.first.leading_lines) if region.first is not None and any(region.first is d for d in region.dropped) else []
        part = [*region.before, grad_call, self._accumulate_stmt(total, micro), *region.after]
        if lead:
            part[0] = part[0].with_changes(leading_lines=lead)
        upd_comments = [line for s in [*clips, step_piece.stmt] for line in s.leading_lines]
        kept = [p.stmt for p in rest if p.kind != "zero_grad"]
        reset = cst.parse_statement(f"{total} = None\n")
        new_gate = gate.with_changes(body=gate.body.with_changes(
            body=[upd_call.with_changes(leading_lines=upd_comments), *kept, reset]))
        init = cst.parse_statement(f"{total} = None\n")
        return [*part, new_gate, *tail], [grad_text, upd_text], self._imports(clips), init

    def _later_reads(self, scope, loop) -> set[str]:
        stripped = loop.with_changes(body=cst.IndentedBlock([cst.SimpleStatementLine([cst.Pass()])]))
        body = scope.body if isinstance(scope, cst.FunctionDef) else scope
        try:
            replaced = body.deep_replace(loop, stripped)
        except Exception:
            replaced = body
        return set(lp.reads(replaced))

    def _manual(self, loop, reason: str) -> None:
        reason = " ".join(line.strip() for line in reason.splitlines())
        if any(MANUAL in line.comment.value for line in loop.leading_lines if line.comment):
            self.report(loop, f"training step not rewritten: {reason}", severity=Severity.ERROR)
            return
        comment = cst.EmptyLine(comment=cst.Comment(f"# {MANUAL} (JX301): {reason}"))
        # a callable: another rule's edits inside the loop in the same pass are kept
        fix = Fix((self.replace(loop, lambda updated: updated.with_changes(leading_lines=[*updated.leading_lines, comment])),),
                  Safety.SAFE, description="mark the loop for a manual port")
        self.report(loop, f"training step not rewritten: {reason}", fix, severity=Severity.ERROR)

    # ----------------------------------------------------------------------------------
    def _build(self, region: lp.Region, fn, loop, several: bool, aliases=None,
               grads_out: "str | None" = None, update: bool = True, reuse: bool = False) -> tuple[str, cst.BaseStatement]:
        """The step's definition and its call. ``update=False``: a gradient step of one
        micro-batch (no optimizer parameter, no update): it returns the gradients too.
        ``reuse``: where the module already defines the same step under another name (a
        script's second loop over the same model, optimizer and forward pass), the definition
        is "" and the call calls that one."""
        ctx = self.ctx
        facts = lp.file_facts(ctx)
        nnx = lp.nnx_name(ctx)
        model, opt = region.model, region.optimizer
        assert model is not None
        aliases = aliases or {}
        if fn is not None:
            local = lp.function_locals(fn) | set(aliases)
        else:  # a script's top level: what the loops around the step bind changes per step
            local = set()
            for anc in ctx.ancestors:
                if isinstance(anc, (cst.For, cst.While)):
                    local |= _module_assigned(anc)
        region, hoisted = _hoist_host(region, ctx)
        # names the moved code reads before binding them
        moved: list[cst.CSTNode] = list(region.forward)
        bound: set[str] = set()
        free: dict[str, None] = {}
        for s in region.forward:
            for n in lp.reads(s):
                if n not in bound:
                    free[n] = None
            bound |= lp.binds(s)
        tail_nodes = [*region.losses, *(c.call for c in region.clips)]
        for node in tail_nodes:
            for n in lp.reads(node):
                if n not in bound:
                    free[n] = None
        if aliases:
            facts = _with_aliases(facts, aliases)
        if fn is not None and model not in local and model not in facts.toplevel:
            raise lp.Unsupported(f"the model {opt} trains ({model}) is not visible in this function")
        if "self" in free:
            raise lp.Unsupported("the step reads `self` (a trainer method): move the model and optimizer to arguments")
        dynamic: list[str] = []
        static: list[str] = []  # parameter names
        static_values: list[str] = []  # call-site expressions
        renames: dict[str, str] = {}  # "args.clip" -> "clip"
        called = {c.func.value for s in [*moved, *tail_nodes] for c in astutil.calls_in(s) if isinstance(c.func, cst.Name)}
        taken = set(free) | bound | {model, opt}
        host_params = []
        for _, expr in hoisted:
            hint = next((n for n in reversed(list(lp.reads(expr))) if n not in ("np", "numpy", "torch")), "host")
            name, i = f"{hint}_array", 2
            while name in taken:
                name, i = f"{hint}_array_{i}", i + 1
            taken.add(name)
            host_params.append(name)
        # what an `if` of the forward pass branches on (the script's settings): static
        branch_on = {n for s in region.forward if isinstance(s, cst.If) for n in lp.if_test_reads(s)}
        for n in free:
            if n in (model, opt) or n in lp._BUILTINS and n not in local:
                continue
            if n not in local and n not in facts.modules:
                continue
            if n in facts.namespaces or n in ("args", "cfg", "config", "hparams", "flags", "FLAGS", "opt_args"):
                chains = _attribute_chains(n, [*moved, *tail_nodes])
                if chains is None:
                    raise lp.Unsupported(f"the step uses the namespace `{n}` other than through its fields")
                for chain in chains:
                    pname = chain.split(".")[-1]
                    if pname in taken or not pname.isidentifier():
                        pname = chain.replace(".", "_")
                    taken.add(pname)
                    renames[chain] = pname
                    static.append(pname)
                    static_values.append(chain)
                continue
            if n in facts.modules:
                dynamic.append(n)
                continue
            if n in facts.losses or n in called or n in branch_on or _host_scalar(n, fn, loop, facts):
                static.append(n)
                static_values.append(n)
                continue
            dynamic.append(n)
        forward = [_rename(s, renames) for s in region.forward]
        losses = [_rename(r, renames) for r in region.losses]
        clips = [_rename(c.call, renames) for c in region.clips]
        # the loss value
        if len(losses) == 1 and isinstance(losses[0], cst.Name):
            loss_var = losses[0].value
            loss_expr = loss_var
        else:
            loss_var = "loss" if "loss" not in bound else "loss_value"
            loss_expr = " + ".join(_paren(lp.code(x)) for x in losses)
        aux = [n for n in region.outputs if n != loss_var]
        aux_text = aux[0] if len(aux) == 1 else "(" + ", ".join(aux) + ")"
        step = _step_name(ctx, opt, several, "train_step" if update else "grad_step")
        decorator = f"@{nnx}.jit"
        if static:
            decorator += "(static_argnames=(" + ", ".join(f'"{s}"' for s in static) + ("," if len(static) == 1 else "") + "))"
        params = [model, opt, *dynamic, *host_params, *static] if update else [model, *dynamic, *host_params, *static]
        # a name the forward pass reads and then rebinds (`output, hidden = model(x, hidden)`)
        # is a parameter of loss_fn: a closure variable cannot be rebound in the inner function
        carried = [renames.get(n, n) for n in free if n in bound and n != model]
        # other models the forward pass calls (a GAN's generator in the discriminator's step):
        # arguments of the inner function too, so that what their layers update (BatchNorm's
        # running statistics) leaves the differentiated trace; gradients are the model's only
        carried += [n for n in dynamic if n in facts.modules and n != model and n not in carried]
        inner = ", ".join([model, *carried])
        # the inner function's name must not hide a name the step reads (a script's own
        # `loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()` would make the step call itself)
        inner_fn = _fresh("loss_fn", taken | set(params) | set(renames.values()) | called | {loss_var, *aux})
        lines = [decorator, f"def {step}({', '.join(params)}):", f"    def {inner_fn}({inner}):", "        __porter_forward__"]
        if aux:
            lines.append(f"        return {loss_expr}, {aux_text}")
            lines.append(f"    ({loss_var}, {aux_text}), grads = {nnx}.value_and_grad({inner_fn}, has_aux=True)({inner})")
        else:
            lines.append(f"        return {loss_expr}")
            lines.append(f"    {loss_var}, grads = {nnx}.value_and_grad({inner_fn})({inner})")
        for piece, call in zip(region.clips, clips):
            kind = lp._CLIP[ctx.qualname(piece.call.func) or ""]
            params_arg = astutil.arg(piece.call, "parameters", 0)
            if params_arg is None or lp.code(params_arg.value).replace(" ", "") != f"{model}.parameters()":
                raise lp.Unsupported(f"`{lp.code(piece.stmt).strip()}` clips other parameters than {model}'s")
            if kind == "norm":
                limit = astutil.arg(call, "max_norm", 1)
                other = [a for a in call.args[2:] if a.keyword is None or a.keyword.value not in ("max_norm",)]
                if limit is None or other:
                    raise lp.Unsupported(f"`{lp.code(piece.stmt).strip()}`: only (parameters, max_norm) is translated")
                lines.append(f"    grads, _ = optax.clip_by_global_norm({lp.code(limit.value)}).update(grads, optax.EmptyState())")
            else:
                limit = astutil.arg(call, "clip_value", 1)
                if limit is None:
                    raise lp.Unsupported(f"`{lp.code(piece.stmt).strip()}`: no clip value")
                lines.append(f"    grads, _ = optax.clip({lp.code(limit.value)}).update(grads, optax.EmptyState())")
        if update:
            lines.append(f"    {opt}.update({model}, grads)")
        outs = [loss_var, *aux]
        # the gradients, where the code between backward() and step() reads them (`.grad`)
        lines.append(f"    return {', '.join(outs + (['grads'] if grads_out else []))}")
        text = "\n".join(lines) + "\n"
        module = cst.parse_module(text)
        module = module.visit(_Splice(forward))
        module = module.visit(_HostNames(host_params))
        values = [*dynamic, *(lp.code(expr) for _, expr in hoisted)]
        args = [model, opt, *values, *static_values] if update else [model, *values, *static_values]
        targets = outs + ([grads_out] if grads_out else [])
        same = _same_definition(ctx.module, module.body[0]) if reuse else None
        if same is not None:
            call = cst.parse_statement(f"{', '.join(targets)} = {same}({', '.join(args)})\n")
            return "", call
        call = cst.parse_statement(f"{', '.join(targets)} = {step}({', '.join(args)})\n")
        return module.code, call


# calls that make an array of host data: NumPy's, and torch's constructors of data (the ops
# rules turn them into NumPy where they end up)
_HOST_CALLS = ("numpy.",)
_HOST_CONSTRUCTORS = ("torch.tensor", "torch.as_tensor", "torch.Tensor", "torch.LongTensor", "torch.FloatTensor",
                      "torch.DoubleTensor", "torch.IntTensor", "torch.BoolTensor", "torch.ByteTensor",
                      "torch.from_numpy", "torch.autograd.Variable", "torch.autograd.variable.Variable")


def _hoist_host(region: lp.Region, ctx) -> "tuple[lp.Region, list[tuple[cst.Name, cst.BaseExpression]]]":
    """NumPy calls of the forward pass that read no value the step computes
    (`np.asarray([word_to_ix[target]], dtype=np.int64)`: a target made on the host from a
    Python string) are computed where the step is called and passed in as arrays: inside the
    jitted step NumPy sees tracers or closure values frozen at the first trace, and a Python
    string cannot be a jitted argument. Each is replaced by a marker Name (renamed to its
    parameter once the step is built); NumPy's random draws are left where they are."""
    bound: set[str] = {region.model or ""}
    for stmt in region.forward:
        bound |= lp.binds(stmt)
    found: list[tuple[cst.Name, cst.BaseExpression]] = []
    replaced: dict[int, cst.Name] = {}
    covered: set[int] = set()  # the nodes inside a hoisted call
    for node in [*region.forward, *region.losses]:
        for n in astutil.walk(node):
            if not isinstance(n, cst.Call) or id(n) in covered:
                continue
            qual = ctx.qualname(n.func) or ""
            if not (qual.startswith(_HOST_CALLS) or qual in _HOST_CONSTRUCTORS) or qual.startswith("numpy.random"):
                continue
            inner = list(astutil.walk(n))
            if any(isinstance(m, cst.Call) and (ctx.qualname(m.func) or "").startswith("numpy.random") for m in inner):
                continue
            reads = set(lp.reads(n)) - {"np", "numpy", "torch", "autograd", "Variable"}
            if not reads or reads & bound or any(isinstance(m, (cst.Lambda, cst.Yield, cst.Await)) for m in inner):
                continue
            marker = cst.Name(f"__porter_host_{len(found)}__")
            replaced[id(n)] = marker
            covered.update(id(m) for m in inner)
            found.append((marker, n))
    if not found:
        return region, []

    class _Put(cst.CSTTransformer):
        def leave_Call(self, original, updated):
            return replaced.get(id(original), updated)

    forward = [s.visit(_Put()) for s in region.forward]
    losses = [x.visit(_Put()) for x in region.losses]
    return dataclasses.replace(region, forward=forward, losses=losses), found


class _HostNames(cst.CSTTransformer):
    """The markers of :func:`_hoist_host` -> the step's parameter names."""

    def __init__(self, names: list[str]) -> None:
        super().__init__()
        self.names = names  # in the markers' order

    def leave_Name(self, original, updated):
        if updated.value.startswith("__porter_host_"):
            return updated.with_changes(value=self.names[int(updated.value[len("__porter_host_"):-2])])
        return updated


def _same_definition(module: cst.Module, new: cst.FunctionDef) -> "str | None":
    """The name of a top-level function of ``module`` that is ``new`` but for its name."""
    want = cst.Module([new.with_changes(leading_lines=[])]).code
    for stmt in module.body:
        if isinstance(stmt, cst.FunctionDef) and stmt.name.value != new.name.value:
            if cst.Module([stmt.with_changes(name=new.name, leading_lines=[])]).code == want:
                return stmt.name.value
    return None


def _fresh(base: str, taken: set[str]) -> str:
    """``base``, or the first of compute_loss, loss_fn_2, ... that no name in ``taken`` is."""
    for name in (base, "compute_loss"):
        if name not in taken:
            return name
    i = 2
    while f"{base}_{i}" in taken:
        i += 1
    return f"{base}_{i}"


class _GradReads(cst.CSTTransformer):
    """`linear.weight.grad` (the model's own array, a layer of lp.LAYER_ARRAYS) ->
    the step's gradient of it, in torch's layout: `grads["kernel"][...].T`."""

    def __init__(self, ctx, model: str, grads: str) -> None:
        super().__init__()
        self.ctx, self.model, self.grads = ctx, model, grads

    def leave_Attribute(self, original, updated):
        if original.attr.value != "grad":
            return updated
        array = lp.layer_array(self.ctx, original.value) if isinstance(original.value, cst.Attribute) else None
        if array is None or array[0] != self.model:
            raise lp.Unsupported(f"`{lp.code(original)}` is not the gradient of an array porter can name in "
                                 f"{self.model}'s gradients")
        _, name, transposed = array
        return cst.parse_expression(f'{self.grads}["{name}"][...]' + (".T" if transposed else ""))


def call_name(stmt: cst.BaseStatement) -> str:
    assign = stmt.body[0]  # type: ignore[attr-defined]
    return lp.code(assign.value.func)


def _paren(text: str) -> str:
    return text if text.replace("_", "").replace(".", "").isalnum() else f"({text})"


class _Splice(cst.CSTTransformer):
    def __init__(self, stmts) -> None:
        super().__init__()
        self.stmts = stmts

    def leave_SimpleStatementLine(self, original, updated):
        if (len(updated.body) == 1 and isinstance(updated.body[0], cst.Expr)
                and isinstance(updated.body[0].value, cst.Name) and updated.body[0].value.value == "__porter_forward__"):
            return cst.FlattenSentinel(self.stmts)
        return updated


class _Renamer(cst.CSTTransformer):
    def __init__(self, renames: dict[str, str]) -> None:
        super().__init__()
        self.renames = renames

    def leave_Attribute(self, original, updated):
        text = lp.dotted_name(original)
        if text in self.renames:
            return cst.Name(self.renames[text])
        return updated


def _rename(node, renames):
    if not renames:
        return node
    return node.visit(_Renamer(renames))


def _attribute_chains(name: str, nodes) -> list[str] | None:
    """The distinct `name.a[.b]` chains read in ``nodes``; None if ``name`` is used otherwise."""
    chains: dict[str, None] = {}
    uses = 0
    for node in nodes:
        for n in astutil.walk(node, into_functions=True):
            if isinstance(n, cst.Attribute) and isinstance(n.value, cst.Name) and n.value.value == name:
                chains[f"{name}.{n.attr.value}"] = None
        uses += sum(1 for n in astutil.walk(node, into_functions=True) if isinstance(n, cst.Name) and n.value == name)
    attr_uses = 0
    for node in nodes:
        attr_uses += sum(1 for n in astutil.walk(node, into_functions=True)
                         if isinstance(n, cst.Attribute) and isinstance(n.value, cst.Name) and n.value.value == name)
    if attr_uses != uses:
        return None
    return list(chains)


_SCALAR_CALLS = ("len", "int", "float", "round", "min", "max", "abs")


def _host_scalar(name: str, fn, loop, facts) -> bool:
    """``name`` is a Python number fixed before the loop: every binding in the function is
    a numeric literal, a field of an argparse namespace, len()/int()/... of such, or
    arithmetic on those. Passed as a static argument (it may be a shape)."""
    if fn is None:
        return False
    bindings = []
    for node in astutil.walk(fn.body):
        if isinstance(node, cst.Assign) and any(name in astutil.target_names(t.target) for t in node.targets):
            if len(node.targets) != 1 or not isinstance(node.targets[0].target, cst.Name):
                return False
            bindings.append(node)
        elif isinstance(node, (cst.AugAssign, cst.AnnAssign)) and isinstance(node.target, cst.Name) and node.target.value == name:
            return False
        elif isinstance(node, (cst.For, cst.CompFor)) and name in astutil.target_names(node.target):
            return False
    if any(p.name.value == name for p in lp._params(fn.params)) or not bindings:
        return False
    inside = {id(n) for n in astutil.walk(loop)}
    return all(id(b) not in inside and _scalar_expr(b.value, facts) for b in bindings)


def _scalar_expr(expr, facts) -> bool:
    if isinstance(expr, (cst.Integer, cst.Float)):
        return True
    if isinstance(expr, cst.UnaryOperation):
        return _scalar_expr(expr.expression, facts)
    if isinstance(expr, cst.BinaryOperation):
        return _scalar_expr(expr.left, facts) and _scalar_expr(expr.right, facts)
    if isinstance(expr, cst.Attribute) and isinstance(expr.value, cst.Name):
        return expr.value.value in facts.namespaces or expr.value.value == "args"
    if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Name) and expr.func.value in _SCALAR_CALLS:
        return all(_scalar_expr(a.value, facts) or expr.func.value == "len" for a in expr.args)
    return False


def _with_aliases(facts, aliases):
    """The file facts with `self.x` entries also under the alias `x`."""
    import copy

    out = copy.copy(facts)
    out.modules = facts.modules | {k for k, v in aliases.items() if v in facts.modules}
    out.losses = facts.losses | {k for k, v in aliases.items() if v in facts.losses}
    out.namespaces = facts.namespaces | {k for k, v in aliases.items() if v in facts.namespaces}
    return out


def _module_assigned(module: cst.Module) -> set[str]:
    names: set[str] = set()
    for node in astutil.walk(module):
        if isinstance(node, cst.Assign):
            for t in node.targets:
                names.update(astutil.target_names(t.target))
        elif isinstance(node, (cst.AnnAssign, cst.AugAssign)) and isinstance(node.target, cst.Name):
            names.add(node.target.value)
        elif isinstance(node, cst.For):
            names.update(astutil.target_names(node.target))
        elif isinstance(node, cst.WithItem) and node.asname is not None:
            names.update(astutil.target_names(node.asname.name))
    return names


def _step_name(ctx, opt: str, several: bool, base: str = "train_step") -> str:
    taken = ctx.cache.setdefault(("jx.step_names",), set())
    facts = lp.file_facts(ctx)
    candidates = [f"{base}_{opt}"] if several else [base, f"{base}_{opt}"]
    for c in candidates:
        if c not in taken and c not in facts.toplevel:
            taken.add(c)
            return c
    i = 2
    while f"{base}_{i}" in taken or f"{base}_{i}" in facts.toplevel:
        i += 1
    taken.add(f"{base}_{i}")
    return f"{base}_{i}"


def _spaced(defs):
    return [d.with_changes(leading_lines=[cst.EmptyLine()] if i else []) for i, d in enumerate(defs)]


def _insert_defs_before(defs):
    """Put the step definitions before the top-level statement; they take its leading blank
    lines (not its comments), and one blank line separates each from what follows."""

    def apply(updated):
        lines = list(updated.leading_lines)
        blank = []
        for line in lines:
            if line.comment is not None:
                break
            blank.append(line)
        spaced = []
        for i, d in enumerate(defs):
            spaced.append(d.with_changes(leading_lines=blank if i == 0 or blank else [cst.EmptyLine()]))
        if not blank:
            updated = updated.with_changes(leading_lines=[cst.EmptyLine(), *lines])
        return cst.FlattenSentinel([*spaced, updated])

    return apply


def _backward_outside_loops(stmt: cst.CSTNode) -> bool:
    """A `loss.backward()` in the statement that no loop nested in it holds (those loops are
    training loops of their own)."""
    stack = [stmt]
    while stack:
        n = stack.pop()
        if isinstance(n, (cst.For, cst.While, cst.FunctionDef, cst.Lambda, cst.ClassDef)):
            continue
        if isinstance(n, cst.Call) and astutil.method_name(n) == "backward" and not n.args:
            return True
        stack.extend(astutil.children(n))
    return False
