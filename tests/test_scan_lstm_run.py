"""End to end: nn.LSTM layers ported by TX505 alone to the scan-over-time subclass it defines,
run on torch_xla (PJRT_DEVICE=CPU) against eager nn.LSTM with the same weights: outputs,
final states and parameter gradients agree, the state_dict is nn.LSTM's, and a longer
sequence does not grow the graph."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from porter import engine, registry

# three spellings of the layer, and configurations covering batch_first, bidirectional,
# num_layers, bias and given or zero (h_0, c_0)
PROGRAM = textwrap.dedent(
    """
    import json
    import sys

    import torch
    import torch.nn as nn
    from torch.nn import LSTM
    import torch_xla


    def build(kind, *args, **kwargs):
        if kind == 0:
            return nn.LSTM(*args, **kwargs)
        if kind == 1:
            return torch.nn.LSTM(*args, **kwargs)
        return LSTM(*args, **kwargs)


    def main():
        torch.manual_seed(0)
        device = torch_xla.device()
        configs = [dict(num_layers=2, batch_first=True, bidirectional=True), dict(bias=False), dict(num_layers=2)]
        rows = []
        for kind, kw in enumerate(configs):
            layer = build(kind, 5, 7, **kw).double()
            reference = getattr(nn, 'LSTM')(5, 7, **kw).double()  # a spelling the port leaves alone
            reference.load_state_dict(layer.state_dict())
            layer.to(device)
            x = torch.randn(3, 4, 5, dtype=torch.double)
            hx = None
            if kind == 0:  # given (h_0, c_0)
                h0 = torch.randn(4, 3, 7, dtype=torch.double)
                hx = (h0, torch.randn_like(h0))
            got = []
            for module, dev in ((reference, 'cpu'), (layer, device)):
                out, (h, c) = module(x.to(dev), None if hx is None else tuple(s.to(dev) for s in hx))
                (out.sum() + 2 * h.sum() + 3 * c.sum()).backward()
                torch_xla.sync()
                got.append([out.cpu(), h.cpu(), c.cpu()] + [p.grad.cpu() for p in module.parameters()])
            rows.append({
                'type': type(layer).__name__,
                'keys': list(layer.state_dict()) == list(reference.state_dict()),
                'shapes': [list(a.shape) == list(b.shape) for a, b in zip(*got)],
                'error': max((a - b).abs().max().item() for a, b in zip(*got)),
            })
        # the graph of a step holds one cell: its IR does not grow with the sequence
        layer = nn.LSTM(4, 8).to(device)
        sizes = []
        for length in (4, 16):
            out, _ = layer(torch.randn(length, 2, 4, device=device))
            sizes.append(len(torch_xla._XLAC._get_xla_tensors_text([out])))
        with open(sys.argv[1], 'w') as f:
            json.dump({'rows': rows, 'sizes': sizes}, f)


    if __name__ == '__main__':
        main()
    """
)


@pytest.fixture(scope="module")
def ported(tmp_path_factory):
    pytest.importorskip("torch_xla")
    result = engine.fix(PROGRAM, engine.Options(registry.select("torch-xla", ("TX505",))))
    assert result.changed
    tmp = tmp_path_factory.mktemp("scan_lstm")
    (tmp / "ported.py").write_text(result.source)
    env = dict(os.environ, PJRT_DEVICE="CPU")
    proc = subprocess.run([sys.executable, str(tmp / "ported.py"), str(tmp / "out.json")], capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return result, json.loads((tmp / "out.json").read_text())


def test_every_spelling_is_rewritten(ported):
    result, _ = ported
    assert result.source.count("class XlaScanLSTM(torch.nn.LSTM):") == 1
    assert "return XlaScanLSTM(*args, **kwargs)" in result.source
    assert "nn.LSTM(*args" not in result.source and "return LSTM(" not in result.source
    assert not [f for f in result.remaining if f.code == "TX505"]


def test_same_values_and_gradients_as_nn_lstm(ported):
    _, out = ported
    assert len(out["rows"]) == 3
    for row in out["rows"]:
        assert row["type"] == "XlaScanLSTM" and row["keys"] and all(row["shapes"])
        assert row["error"] < 1e-12


def test_graph_does_not_grow_with_the_sequence(ported):
    _, out = ported
    short, long = out["sizes"]
    assert long < short * 1.5
