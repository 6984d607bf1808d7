"""JX901 (torch code left in a JAX port, reported at its line) on whole ports: several spellings
of each kind of leftover, what is not reported (the host-side input pipeline), and the eval
step's def kept when the evaluation loop sits in a `with torch.no_grad():` block (JX310)."""
import textwrap

import pytest

from porter import engine, registry

JAX = engine.Options(tuple(registry.rules_for("jax")), unsafe_fixes=True)
SAFE = engine.Options(tuple(registry.rules_for("jax")))

MODEL = '''
import torch
import torch.nn as nn
import torchvision


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(x)

'''


def port(body: str, options=JAX):
    return engine.fix(MODEL + textwrap.dedent(body), options)


def left(result) -> list[tuple[int, str]]:
    """(line, the line's text) of each JX901 finding."""
    lines = result.source.splitlines()
    return [(f.position.line, lines[f.position.line - 1].strip()) for f in result.remaining if f.code == "JX901"]


@pytest.mark.parametrize("body", [
    "model = Net()\nmodel.eval()\nwith torch.no_grad():\n    for x, y in test_loader:\n        out = model(x)\n        print(torch.max(out.data, 1))\n",
    "model = Net()\n\ndef test(model, loader):\n    model.eval()\n    with torch.no_grad():\n        correct = 0\n        for x, y in loader:\n            out = model(x)\n            correct += (out.argmax(1) == y).sum().item()\n    return correct\n",
    "model = Net()\nmodel.eval()\nwith torch.inference_mode():\n    for batch in test_loader:\n        logits = model(batch[0])\n",
    "model = Net()\nwith torch.no_grad():\n    total = 0\n    for x, y in test_loader:\n        out = model(x)\n        total += out.shape[0]\n",
], ids=["module-no-grad", "function-no-grad", "inference-mode", "no-grad-without-eval-call"])
def test_eval_step_is_defined_where_it_is_called(body):
    result = port(body)
    assert "eval_step(model, " in result.source
    assert "def eval_step(model, *inputs):" in result.source, result.source
    compile(result.source, "<port>", "exec")


def test_data_of_a_jax_value_is_dropped_and_torch_calls_are_reported():
    result = port("""
        model = Net()
        model.eval()
        with torch.no_grad():
            for x, y in test_loader:
                out = model(x)
                _, predicted = torch.max(out.data, 1)
                counts = torch.histc(out, bins=4)
    """)
    assert ".data" not in result.source.split("class Net", 1)[1].split("def eval_step", 1)[1]
    found = left(result)
    assert any("torch.histc" in text for _, text in found), found


@pytest.mark.parametrize("body,words", [
    ("h = model_out\nif isinstance(h, torch.Tensor):\n    h = h.detach()\n", "isinstance(h, (torch.Tensor, jax.Array))"),
    ("def repackage(h):\n    if isinstance(h, (torch.Tensor, list)):\n        return h\n    return tuple(repackage(v) for v in h)\n",
     "isinstance(h, (torch.Tensor, list, jax.Array))"),
    ("def repackage(h):\n    if isinstance(h, torch.Tensor):\n        return h.detach()\n    return tuple(repackage(v) for v in h)\n",
     "isinstance(h, (torch.Tensor, jax.Array))"),
])
def test_isinstance_torch_tensor_also_holds_for_a_jax_array(body, words):
    """A safe fix (what passed still passes, and the port's arrays stand for the original's
    tensors): a word-level LM's repackage_hidden recursed into a JAX state and failed with
    'iteration over a 0-d array'."""
    for options in (SAFE, None):
        result = port(body, options) if options is not None else port(body)
        assert words in result.source
        assert not any("isinstance" in text for _, text in left(result)), left(result)


def test_isinstance_nn_parameter_becomes_jax_array_unsafe():
    body = "for p in params:\n    if isinstance(p, torch.nn.Parameter):\n        print(p.shape)\n"
    assert "isinstance(p, jax.Array)" in port(body).source
    assert "torch.nn.Parameter" in port(body, SAFE).source


@pytest.mark.parametrize("body,needle", [
    ("model = torchvision.models.resnet18(num_classes=10)\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
     "for x, y in loader:\n    optimizer.zero_grad()\n    loss = criterion(model(x), y)\n    loss.backward()\n    optimizer.step()\n",
     "torchvision.models.resnet18"),
    ("model = Net()\nfor x, y in loader:\n    out = model(x)\n    print(torch.cuda.max_memory_allocated())\n",
     "torch.cuda.max_memory_allocated()"),
    # (JX313 ports a plain chain of assignments; one through an in-place op stays)
    ("w = torch.tensor([1.0], requires_grad=True)\nh = w * 2\nh.mul_(3)\ny = h.sum()\ny.backward()\nprint(w.grad)\n",
     "y.backward()"),
    ("model = Net()\nfor name, p in model.named_parameters():\n    print(name)\n", "named_parameters"),
    ("model = Net()\nfor param in model.parameters():\n    print(param)\n", "parameters()"),
    ("model = Net()\nprint(next(model.parameters())[:, 3])\n", "parameters()"),
    ("model = Net()\nfor name, m in model.named_modules():\n    print(name)\n", "named_modules()"),
], ids=["torchvision-model", "cuda-memory", "backward-outside-loop", "named_parameters", "parameters-loop", "next-parameters",
        "named_modules"])
def test_leftovers_are_reported_at_their_line(body, needle):
    result = port(body)
    found = left(result)
    assert any(needle in text for _, text in found), (found, result.source.split("class Net", 1)[1])


@pytest.mark.parametrize("body,words", [
    ("model = Net()\nfor x, y in loader:\n    if x.is_cuda:\n        print('gpu')\n    out = model(x)\n", "    out = model(x)"),
    ("model = Net()\nfor x, y in loader:\n    out = model(x)\n    torchvision.utils.save_image(out, 'a.png')\n",
     "torchvision.utils.save_image(torch.as_tensor(np.asarray(out)), 'a.png')"),
    ("model = Net()\nimport torchvision.utils as vutils\nfor x, y in loader:\n    vutils.save_image(model(x), 'b.png', nrow=4)\n",
     "vutils.save_image(torch.as_tensor(np.asarray(model(x))), 'b.png', nrow=4)"),
], ids=["is_cuda", "save_image", "save_image-alias"])
def test_cuda_tests_and_image_helpers_are_fixed_safely(body, words):
    """`x.is_cuda` is False for every array of a JAX port (JX317 keeps the branch it takes);
    torchvision's image helpers get a torch tensor of the port's array (JX318)."""
    result = port(body, SAFE)
    assert words in result.source, result.source
    assert "is_cuda" not in result.source and "print('gpu')" not in result.source
    assert not [text for _, text in left(result) if "is_cuda" in text or "save_image" in text], left(result)


def test_a_library_model_is_reported_where_it_is_built():
    """A model torchvision, timm or torch.hub builds stays a torch module: the finding is at the
    line that builds it, and the port does not count its parameters as an NNX module's."""
    result = port("import timm\nmodel = torchvision.models.resnet18().to(device)\n"
                  "optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)\n"
                  "backbone = timm.create_model('resnet18', num_classes=10)\n"
                  "print(sum(p.numel() for p in backbone.parameters()))\n")
    lines = result.source.splitlines()
    built = [lines[f.position.line - 1] for f in result.remaining if "a torch module built by" in f.message]
    assert built == ["model = torchvision.models.resnet18()", "backbone = timm.create_model('resnet18', num_classes=10)"], \
        result.remaining
    assert "nnx.state(backbone" not in result.source and "sum(p.numel() for p in backbone.parameters())" in result.source


def test_a_loop_still_calling_backward_is_reported():
    # two models stepped by one optimizer over a list: the training-step rules leave the loop alone
    result = port("""
        a, b = Net(), Net()
        optimizer = torch.optim.SGD(list(a.parameters()) + list(b.parameters()), lr=0.1)
        for x, y in loader:
            optimizer.zero_grad()
            loss = ((a(x) - b(x)) ** 2).mean()
            loss.backward()
            optimizer.step()
    """)
    found = left(result)
    assert any("loss.backward()" in text for _, text in found), found
    assert any("optimizer.zero_grad()" in text for _, text in found), found


def test_the_input_pipeline_is_not_reported():
    result = port("""
        class Pairs(torch.utils.data.Dataset):
            def __len__(self):
                return 8

            def __getitem__(self, i):
                return torch.randn(4), torch.tensor(i % 2)

        torch.manual_seed(0)
        loader = torch.utils.data.DataLoader(Pairs(), batch_size=4, shuffle=True)
        transform = torchvision.transforms.Compose([torchvision.transforms.ToTensor()])
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        model = Net()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            x, y = x.to(device), y.to(device)  # JX303: the batch crosses into the jitted step as numpy
            optimizer.zero_grad()
            loss = ((model(x) - 1) ** 2).mean()
            loss.backward()
            optimizer.step()
    """)
    assert left(result) == [], left(result)


@pytest.mark.parametrize("body,reported", [
    ("loader = torch.utils.data.DataLoader(ds, batch_size=4)\nmodel = Net()\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
     "for i, (x, y) in enumerate(loader):\n    x = x.reshape(-1, 4)\n    optimizer.zero_grad()\n    loss = ((model(x) - y) ** 2).mean()\n"
     "    loss.backward()\n    optimizer.step()\n", False),
    ("loader = torch.utils.data.DataLoader(ds, batch_size=4)\nmodel = Net()\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
     "for x, y in loader:\n    x, y = x.to('cpu'), y.to('cpu')\n    optimizer.zero_grad()\n    loss = ((model(x) - y) ** 2).mean()\n"
     "    loss.backward()\n    optimizer.step()\n", False),
    ("loader = torch.utils.data.DataLoader(ds, batch_size=4)\nmodel = Net()\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
     "for batch in loader:\n    x, y = batch\n    optimizer.zero_grad()\n    loss = ((model(x) - y) ** 2).mean()\n"
     "    loss.backward()\n    optimizer.step()\n", False),
    # a batch the jitted step closes over
    ("loader = torch.utils.data.DataLoader(ds, batch_size=4)\nmodel = Net()\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
     "x, y = next(iter(loader))\nfor step in range(3):\n    optimizer.zero_grad()\n    loss = ((model(x) - y) ** 2).mean()\n"
     "    loss.backward()\n    optimizer.step()\n", False),
], ids=["batch-not-moved", "batch-moved-to-device", "batch-unpacked-in-the-body", "one-batch-before-the-loop"])
def test_a_torch_batch_given_to_the_jitted_step_is_reported(body, reported):
    """JX303 converts a batch the loop target names (moved to a device or not), the parts of
    one the body unpacks, and a batch taken before the loop (`next(iter(loader))`): none is a
    torch tensor at the jitted step, and JX901 has nothing to say."""
    result = port(body)
    found = [text for _, text in left(result) if "train_step(" in text]
    assert bool(found) == reported, (found, result.source.split("def torch_state_dict", 1)[1])
    if not reported:
        assert ".numpy()" in result.source.split("loader = ", 1)[1], result.source
