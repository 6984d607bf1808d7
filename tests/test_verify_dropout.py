"""`porter verify --script` gives both sides the same dropout masks for the channel dropouts
(`nn.Dropout2d`, `F.dropout2d`, `nn.Dropout1d`), on the torch-xla and the JAX port alike: a
classic MNIST-style CNN with `Dropout2d` after its convolutions diverged at step 1 (the CPU
original drew its masks with torch's native kernel, the XLA port with XLA's generator). The
dropout inside an RNN kernel cannot be aligned: the report says so."""
import textwrap

import pytest
import torch

from porter import engine, registry

from scripthelp import verify_json

ORIGINAL = textwrap.dedent('''
    import argparse

    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, TensorDataset


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 4, 3)
            self.conv2 = nn.Conv2d(4, 8, 3)
            self.drop = nn.Dropout2d(0.25)
            self.fc = nn.Linear(8 * 4 * 4, 10)

        def forward(self, x):
            x = F.relu(self.conv1(x))
            x = F.dropout2d(F.relu(self.conv2(x)), 0.1, training=self.training)
            x = self.drop(F.max_pool2d(x, 2))
            return F.log_softmax(self.fc(torch.flatten(x, 1)), dim=1)


    def main():
        parser = argparse.ArgumentParser()
        parser.add_argument('--no-cuda', action='store_true', default=False)
        args = parser.parse_args()
        use_cuda = not args.no_cuda and torch.cuda.is_available()
        device = torch.device('cuda' if use_cuda else 'cpu')
        torch.manual_seed(0)
        data = TensorDataset(torch.randn(64, 1, 12, 12), torch.randint(0, 10, (64,)))
        loader = DataLoader(data, batch_size=16, shuffle=True)
        model = Net().to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        model.train()
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = F.nll_loss(model(x), y)
            loss.backward()
            optimizer.step()
            print('loss', loss.item())


    if __name__ == '__main__':
        main()
''').lstrip("\n")


def _verify(tmp_path, target: str) -> dict:
    port = engine.fix(ORIGINAL, engine.Options(tuple(registry.rules_for(target))), "train.py").source
    return verify_json(tmp_path, ORIGINAL, port, 3, port_name=f"port_{target.replace('-', '_')}.py")


@pytest.mark.parametrize("target", [pytest.param("torch-xla", marks=pytest.mark.xla),
                                    pytest.param("jax", marks=pytest.mark.jax)])
def test_channel_dropout_masks_are_the_same_on_both_sides(tmp_path, target):
    report = _verify(tmp_path, target)
    assert report["passed"], report["summary"]
    assert report["settings"]["dtype"] == "float64"
    assert max(step["diff"] for step in report["steps"]) < 1e-9, report["steps"]


def test_channel_dropout_noise_shape():
    from porter.verify.trace import _channel_dropout_shape

    assert _channel_dropout_shape((8, 4, 5, 5), 2) == (8, 4, 1, 1)
    assert _channel_dropout_shape((4, 5, 5), 2) == (4, 1, 1)  # unbatched: one draw per channel
    assert _channel_dropout_shape((8, 4, 7), 1) == (8, 4, 1)


def test_dropout_inside_an_rnn_kernel_is_noted():
    from porter.verify.trace import _Recorder

    class LM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = torch.nn.LSTM(4, 4, num_layers=2, dropout=0.2)
            self.single = torch.nn.GRU(4, 4, num_layers=1)

    recorder = _Recorder()
    model = LM()  # the optimizer's model is found among the live modules
    recorder.on_optimizer_created(torch.optim.SGD(model.parameters(), lr=0.1))
    assert len(recorder.unaligned) == 1 and "LM.rnn (LSTM, dropout=0.2)" in recorder.unaligned[0], recorder.unaligned


def test_rnn_dropout_of_a_model_without_an_optimizer_is_noted(tmp_path):
    """A script whose updates are manual (`p.data.add_(p.grad, alpha=-lr)`) creates no
    optimizer: the RNN's dropout is noted as the module runs in training mode (and not for a
    module that only evaluates)."""
    from porter.verify.trace import trace_script

    script = tmp_path / "lm.py"
    script.write_text(textwrap.dedent('''
        import torch
        import torch.nn as nn

        torch.manual_seed(0)
        rnn = nn.GRU(4, 8, num_layers=2, dropout=0.3)
        frozen = nn.LSTM(4, 8, num_layers=3, dropout=0.5).eval()
        head = nn.Linear(8, 1)
        for _ in range(3):
            x = torch.randn(5, 2, 4)
            with torch.no_grad():
                frozen(x)
            out, _ = rnn(x)
            loss = head(out).pow(2).mean()
            rnn.zero_grad()
            head.zero_grad()
            loss.backward()
            for p in list(rnn.parameters()) + list(head.parameters()):
                p.data.add_(p.grad, alpha=-0.1)
    ''').lstrip("\n"))
    record = trace_script(script, host_random=True, seed=0, max_steps=2, cwd=tmp_path, timeout=120)
    assert record["num_steps"] == 2, record.get("exception")
    assert record["unaligned_random"] == [
        "GRU(num_layers=2, dropout=0.3) draws its dropout inside torch's RNN kernel, which the comparison cannot "
        "give both sides: run the script with that dropout off to compare"], record["unaligned_random"]
