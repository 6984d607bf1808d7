"""A CUDA device string kept in a variable (codemods/torch_xla/_device_strings.py, TX103): it
becomes 'xla' with its device-type tests where every read is a device use, through the whole
torch-xla rule set in default mode; any other read keeps it and is reported at its line."""
import argparse
import textwrap

import libcst as cst
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



# A command-line option whose default is a CUDA device string (TX103 with
# _device_strings.option_default_fact): 'xla' in default mode where every read of the option
# is a device use or text and every use of the namespace is followed or known.
OPTION_SPELLINGS = {
    # an alias guarded by availability checks: the CUDA guard is dropped (the port's accelerator
    # is there), and a test against another device's string reads 'xla' as it read 'cuda'
    "the option under another name, guarded": """
        import argparse
        import torch
        parser = argparse.ArgumentParser()
        parser.add_argument('--device', type=str, default='cuda', help='training device')
        opt = parser.parse_args()
        device_name = opt.device
        if device_name == 'cuda' and not torch.cuda.is_available():
            print('cuda is not available')
            exit(-1)
        elif device_name == 'mps' and not torch.backends.mps.is_available():
            print('mps is not available')
            exit(-1)
        device = torch.device(device_name)
        model = Net().to(device)
    """,
    "module-level parser, device uses and text": """
        import argparse
        import torch
        parser = argparse.ArgumentParser()
        parser.add_argument('--device', default='cuda', help='device to train on')
        parser.add_argument('--lr', type=float, default=0.1)
        args = parser.parse_args()
        device = torch.device(args.device)
        model = Net().to(args.device)
        x = torch.zeros(3, device=args.device)
        print(f"training on {args.device} with lr {args.lr}", args.device)
    """,
    "an argument group, the namespace returned by a function": """
        import argparse
        import torch

        def get_args():
            parser = argparse.ArgumentParser()
            group = parser.add_argument_group('Device parameters')
            group.add_argument("--device", type=str, default="cuda:0")
            return parser.parse_args()

        def main():
            opt = get_args()
            model = Net().to(device=opt.device)
            batch = torch.ones(2).to(opt.device, non_blocking=True)
    """,
    "dest=, a short option, the namespace passed to the program's functions": """
        import argparse
        import torch

        def train(cfg, model, *args, steps=1):
            for x in loader:
                x = x.to(cfg.device)
                noise = torch.randn(2, device=cfg.device)

        def evaluate(model, *, options):
            return model.to(torch.device(options.device))

        if __name__ == '__main__':
            p = argparse.ArgumentParser()
            p.add_argument('-d', dest='device', default=f'cuda:{0}')
            settings, unknown = p.parse_known_args()
            train(settings, Net())
            evaluate(Net(), options=settings)
    """,
    "timm's train.py class: a device setup, records and functions that read other options": """
        import argparse
        import torch
        import yaml
        from timm import utils
        from timm.data import resolve_data_config
        from timm.optim import optimizer_kwargs

        parser = argparse.ArgumentParser()
        group = parser.add_argument_group('Device parameters')
        group.add_argument('--device', default='cuda', type=str, help='Device (accelerator) to use.')

        def _parse_args():
            args = parser.parse_args()
            args_text = yaml.safe_dump(args.__dict__, default_flow_style=False)
            return args, args_text

        def main():
            args, args_text = _parse_args()
            device = utils.init_distributed_device(args)
            if utils.is_primary(args):
                print(f'Training on 1 device ({args.device}).')
            data_config = resolve_data_config(vars(args), verbose=utils.is_primary(args))
            kwargs = optimizer_kwargs(cfg=args)
            if hasattr(args, 'model_ema') or getattr(args, 'lr', None):
                pass
    """,
}


@pytest.mark.parametrize("name", list(OPTION_SPELLINGS))
def test_a_device_option_read_only_as_a_device_defaults_to_xla(name):
    source = OPTION_SPELLINGS[name]
    result = port(source)
    out = text(result, source)
    assert "'cuda" not in out and '"cuda' not in out and "f'cuda" not in out, out
    assert "default='xla'" in out or 'default="xla"' in out, out
    found = messages(result)
    assert not any("command-line default" in m for _, m in found), found


# option reads that are not provably placement: the default stays 'cuda' in default mode, and
# the finding at the option quotes what stops it
OPTION_NOT_PROVABLE = {
    "a device-type test": ("if args.device == 'cuda':\n    print('on the GPU')", "args.device == 'cuda'"),
    "a prefix test": ("on_gpu = args.device.startswith('cuda')", "on_gpu = args.device.startswith('cuda')"),
    "getattr of the option": ("dev = getattr(args, 'device')", "getattr(args, 'device')"),
    "vars() spread into a function porter does not know": ("model = build(**vars(args))", "build(**vars(args))"),
    "the namespace passed to a library function porter does not know": ("setup_distributed(args)", "setup_distributed(args)"),
    "the namespace stored": ("trainer.args = args", "trainer.args = args"),
    "the option copied to a variable": ("device = args.device", "device = args.device"),
    "the option under another name tested for CUDA": ("device_name = args.device\nif device_name == 'cuda':\n    print('on the GPU')",
                                                      "device_name == 'cuda'"),
    "the namespace passed to a method": ("trainer.fit(args)", "trainer.fit(args)"),
}


@pytest.mark.parametrize("name", list(OPTION_NOT_PROVABLE))
def test_an_option_read_otherwise_keeps_its_default_and_says_why(name):
    line, quoted = OPTION_NOT_PROVABLE[name]
    source = ("import argparse\nimport torch\nparser = argparse.ArgumentParser()\n"
              "parser.add_argument('--device', default='cuda')\nargs = parser.parse_args()\n"
              "model = Net().to(args.device)\n" + line + "\n")
    result = engine.fix(source, SAFE, "train.py")
    out = result.source if result.changed else source
    assert "default='cuda'" in out, out
    found = [m for _, m in messages(result) if "command-line default" in m]
    assert len(found) == 1 and f"not provable here: `{quoted}`" in found[0], found
    unsafe = engine.fix(source, engine.Options(registry.select("torch-xla"), unsafe_fixes=True), "train.py")
    assert "default='xla'" in unsafe.source  # the unsafe fix is still offered


@pytest.mark.parametrize("source, quoted", [
    # the parser is built here and parsed elsewhere (another file reads the options)
    ("import argparse\nimport torch\ndef get_parser():\n    p = argparse.ArgumentParser()\n"
     "    p.add_argument('--device', default='cuda')\n    return p\n", "no `parse_args()` in this file"),
    # choices that do not list 'xla'
    ("import argparse\nimport torch\np = argparse.ArgumentParser()\n"
     "p.add_argument('--device', default='cuda', choices=['cuda', 'cpu'])\nargs = p.parse_args()\n"
     "model = Net().to(args.device)\n", "`choices=['cuda', 'cpu']` has no 'xla'"),
    # a parsed namespace handed on without a name porter follows
    ("import argparse\nimport torch\np = argparse.ArgumentParser()\np.add_argument('--device', default='cuda')\n"
     "run(p.parse_args())\n", "run(p.parse_args())"),
])
def test_an_option_porter_cannot_follow_keeps_its_default(source, quoted):
    result = engine.fix(source, SAFE, "train.py")
    out = result.source if result.changed else source
    assert "default='cuda'" in out, out
    found = [m for _, m in messages(result) if "command-line default" in m]
    assert len(found) == 1 and quoted in found[0], found


def test_a_device_the_user_passes_still_applies():
    # the port of an option read only as a device: argparse gives the user's --device, and the
    # default only where none is passed
    source = textwrap.dedent(OPTION_SPELLINGS["module-level parser, device uses and text"])
    out = port(source).source
    tree = cst.parse_module(out)
    calls = [n for n in tree.body if "add_argument('--device'" in cst.Module([n]).code]
    parser = argparse.ArgumentParser()
    exec(compile(cst.Module(calls).code, "<port>", "exec"), {"parser": parser})
    assert parser.parse_args([]).device == "xla"
    assert parser.parse_args(["--device", "cpu"]).device == "cpu"


DEVICE_FUNCTIONS = {
    "if/return, bound to a variable": """
        import torch
        def get_device():
            if torch.cuda.is_available():
                return "cuda"
            return "cpu"
        def main(model, loader, opt):
            device = get_device()
            model.to(device)
            for x, y in loader:
                x, y = x.to(device), y.to(device)
                loss = (model(x) - y).square().mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
    """,
    "a conditional expression, called where a device goes": """
        import torch
        def default_device():
            return "cuda" if torch.cuda.is_available() else "cpu"
        def main(model, loader, opt):
            model.to(default_device())
            for x, y in loader:
                x, y = x.to(default_device()), y.to(default_device())
                loss = (model(x) - y).square().mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
    """,
    "an ordinal string, tested and printed": """
        import torch
        def pick(rank):
            return f"cuda:{rank}"
        def main(model, loader, opt, rank):
            device = pick(rank)
            if device.startswith("cuda"):
                print("training on", device)
            model.to(device)
            for x, y in loader:
                x, y = x.to(device), y.to(device)
                loss = (model(x) - y).square().mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
    """,
}


@pytest.mark.parametrize("spelling", DEVICE_FUNCTIONS)
def test_a_device_function_returns_xla_and_its_loader_is_the_device_loader(spelling):
    """A function of the file that returns a CUDA device string, every call of which is used as
    a device: it returns 'xla' (default mode, whole rule set), no CUDA string is left, and the
    loop's loader is the device loader with no test for a CPU device (the device is provably
    XLA on every path)."""
    source = DEVICE_FUNCTIONS[spelling]
    result = port(source)
    ported = text(result, source)
    cst.parse_module(ported)
    assert "cuda" not in ported.replace("torch.cuda.is_available()", "")
    assert "pl.MpDeviceLoader(loader, " in ported and "else loader" not in ported
    assert not messages(result)


def test_a_device_function_whose_value_is_passed_on_is_reported_at_its_return():
    """(The string, not a device object: `return 'cuda' if ... else 'cpu'` becomes
    torch_xla.device() by TX101, which any code may be given.)"""
    source = """
        import torch
        def get_device():
            if torch.cuda.is_available():
                return "cuda"
            return "cpu"
        def main(model):
            device = get_device()
            trainer = Trainer(model, device)
            return model.to(device)(torch.zeros(2, 4))
    """
    result = port(source)
    assert 'return "cuda"' in text(result, source)
    found = messages(result)
    assert found and all("returned" in message for _, message in found)
