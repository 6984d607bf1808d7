"""A CUDA device string kept in a variable (codemods/torch_xla/_device_strings.py, TX103): it
becomes 'xla' with its device-type tests where every read is a device use, through the whole
torch-xla rule set in default mode; any other read keeps it and is reported at its line."""
import textwrap

import pytest

from porter import engine, registry

SAFE = engine.Options(registry.select("torch-xla"), unsafe_fixes=False)


def port(source: str) -> engine.FixResult:
    result = engine.fix(textwrap.dedent(source), SAFE, "train.py")
    again = engine.fix(result.source if result.changed else textwrap.dedent(source), SAFE, "train.py")
    assert not again.changed, "a second run changed the port"
    return result


def text(result: engine.FixResult, source: str) -> str:
    return result.source if result.changed else textwrap.dedent(source)


def messages(result: engine.FixResult, code: str = "TX103") -> list[tuple[int, str]]:
    return [(f.position.line, f.message) for f in result.remaining if f.code == code]


CONFIG_SPELLINGS = {
    "module-level with a configurator": """
        import torch
        device = 'cuda'
        exec(open('configurator.py').read())
        device_type = 'cuda' if 'cuda' in device else 'cpu'
        ctx = torch.autocast(device_type=device_type) if device_type != 'cpu' else None
        x = torch.zeros(2, device=device)
    """,
    "an ordinal f-string in a torchrun branch": """
        import os
        import torch
        device = "cuda:0"
        if 'LOCAL_RANK' in os.environ:
            device = f"cuda:{os.environ['LOCAL_RANK']}"
            torch.cuda.set_device(device)
        model.to(torch.device(device))
        on_gpu = device.startswith("cuda")
    """,
    "annotated, in a function": """
        import torch
        def evaluate(model, batch):
            dev: str = 'cuda'
            if dev in ('cuda', 'mps'):
                batch = batch.to(dev, non_blocking=True)
            print("evaluating on", dev, f"({dev})")
            return model(batch)
    """,
    "read by a nested function and a checkpoint load": """
        import torch
        device = 'cuda'
        def load(path):
            state = torch.load(path, map_location=device)
            return state
        def batch(x):
            return x.to(device=device) if device != 'cpu' else x
    """,
}


@pytest.mark.parametrize("name", list(CONFIG_SPELLINGS))
def test_a_string_read_only_as_a_device_becomes_xla(name):
    source = CONFIG_SPELLINGS[name]
    result = port(source)
    out = text(result, source)
    assert "'cuda" not in out and '"cuda' not in out, out
    assert "xla" in out
    assert not any("CUDA device string stored" in m for _, m in messages(result)), messages(result)


def test_device_type_tests_take_the_accelerator_path():
    source = CONFIG_SPELLINGS["module-level with a configurator"]
    out = text(port(source), source)
    assert "device = 'xla'" in out
    assert "device_type = 'xla' if 'xla' in device else 'cpu'" in out
    assert "device_type != 'cpu'" in out  # a test against another device type stays


def test_a_string_loader_device_is_still_tested_where_a_configurator_may_set_it():
    # the loader wrapping (TX301) reads `device` after the first pass; the device-type test of
    # the same string is rewritten all the same, and the wrapping keeps the CPU path of --device=cpu
    source = """
        import torch
        from torch.utils.data import DataLoader
        device = 'cuda'
        exec(open('configurator.py').read())
        use_pin = 'cuda' in device
        model = Net().to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in DataLoader(ds, batch_size=4):
            x, y = x.to(device), y.to(device)
            loss = model(x).sum()
            loss.backward()
            opt.step()
    """
    out = text(port(source), source)
    assert "use_pin = 'xla' in device" in out, out
    assert 'torch.device(device).type == "xla"' in out, out


OTHER_USES = {
    "passed to a function of the program": ("""
        import torch
        device = 'cuda'
        model = build(device)
        x = torch.zeros(3).to(device)
    """, 4),
    "returned": ("""
        import torch
        def pick():
            dev = 'cuda:0'
            x = torch.zeros(3, device=dev)
            return dev
    """, 6),
    "stored in a structure": ("""
        import torch
        device = 'cuda'
        config = {'device': device}
        model.to(device)
    """, 4),
    "compared with something else than a string": ("""
        import torch
        device = 'cuda'
        if device == args.device:
            model.to(device)
    """, 4),
    "augmented": ("""
        import torch
        device = 'cuda'
        device += ':1'
        model.to(device)
    """, 4),
}


@pytest.mark.parametrize("name", list(OTHER_USES))
def test_any_other_read_keeps_the_string_and_is_reported_there(name):
    source, line = OTHER_USES[name]
    result = port(source)
    out = text(result, source)
    assert "'cuda" in out or '"cuda' in out, out
    found = messages(result)
    assert any("CUDA device string stored" in m for _, m in found), found
    if name != "augmented":  # (`device += ...` rebinds it: the binding is not a string then)
        assert any(at == line and "used here as something else than a device" in m for at, m in found), found


@pytest.mark.parametrize("source", [
    # a module-level name nobody reads in the file: another file may import it
    "import torch\ndevice = 'cuda'\n",
    # a class attribute and a parameter of the same spelling are other names
    "import torch\nclass Config:\n    device = 'cuda'\n\ndef run(device):\n    return device.upper()\n",
    # a function that declares it global may set it to anything
    "import torch\ndevice = 'cuda'\ndef use_cpu():\n    global device\n    device = 'cpu'\nmodel.to(device)\n",
])
def test_strings_porter_cannot_follow_stay(source):
    result = port(source)
    assert "'cuda'" in text(result, source)

