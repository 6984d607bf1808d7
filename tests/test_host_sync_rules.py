"""Engine-level cases of the host-sync (TX4xx) rules that one rule's examples cannot show:
rules working together in one migrate, one quick fix applied alone, and what stays untouched."""
import textwrap

import pytest

from porter import engine, registry

TX4 = registry.select("torch-xla", ("TX4",))


def fix(source, unsafe=True, rules=TX4):
    return engine.fix(textwrap.dedent(source).lstrip("\n"), engine.Options(rules, unsafe_fixes=unsafe))


TRAIN = """
import time
import torch
import torch_xla

def train(model, loader, optimizer, epoch, log_interval, start):
    total_loss = 0.0
    correct = 0
    seen = 0
    for batch_idx, (data, target) in enumerate(loader):
        optimizer.zero_grad()
        logits = model(data)
        loss = torch.nn.functional.cross_entropy(logits, target)
        loss.backward()
        optimizer.step()
        total_loss += loss.item() * data.size(0)
        correct += (logits.argmax(dim=1) == target).sum().item()
        seen += data.size(0)
        if batch_idx % log_interval == 0:
            print('epoch {} | loss {:.4f} | acc {:.2f}% | {:.1f} ms'.format(
                epoch, loss.item(), 100.0 * correct / seen, 1000.0 * (time.time() - start)))
        torch_xla.sync()
    return total_loss / seen, 100.0 * correct / seen
"""


def test_sums_read_by_a_log_line_travel_into_its_closure():
    out = fix(TRAIN).source
    assert "total_loss += loss.detach() * data.size(0)" in out
    assert "correct += (logits.argmax(dim=1) == target).sum()\n" in out
    # the loop-varying names the line reads are bound now; epoch and start are not rebound.
    # Three of them and a two-line call: a named local function, not a lambda
    assert "def log_step(loss, correct, seen):\n                print(" in out
    assert "xm.add_step_closure(log_step, args=(loss, correct, seen))" in out
    # back to numbers after the loop: float() for the float sum started at 0.0, int() for
    # the count started at 0 (what .item() gave, and the start value after zero iterations)
    assert out.count("    total_loss = float(total_loss)\n") == 1
    assert out.count("    correct = int(correct)\n") == 1
    assert "isinstance(" not in out
    compile(out, "<port>", "exec")
    assert not fix(out).changed


def test_safe_fixes_only_convert_what_they_moved():
    result = fix(TRAIN, unsafe=False)
    out = result.source
    # `correct` is read in the loop (arithmetic in float32): unsafe, so nothing moves ...
    assert "correct += (logits.argmax(dim=1) == target).sum().item()" in out
    assert "total_loss += loss.item()" in out
    assert "isinstance(" not in out
    # ... but the log line still goes into a closure (safe)
    assert "xm.add_step_closure(log_step, args=(loss, correct, seen))" in out
    assert {f.code for f in result.remaining if f.fixable} == {"TX401"}


def test_one_quick_fix_alone_converts_only_its_own_sum():
    source = textwrap.dedent(
        """
        import torch

        def evaluate(model, loader):
            loss_sum = 0.0
            hits = 0
            with torch.no_grad():
                for x, y in loader:
                    out = model(x)
                    loss_sum += torch.nn.functional.cross_entropy(out, y, reduction='sum').item()
                    hits += (out.argmax(1) == y).sum().item()
            return loss_sum, hits
        """
    ).lstrip("\n")
    module = engine.parse(source)
    findings = [f for f in engine.run_rules(module, (registry.find("TX401"),)) if f.fix]
    assert len(findings) == 2
    hits = next(f for f in findings if "`hits" in f.message)
    out = engine.apply_fixes(module, [hits.fix]).code
    assert "hits += (out.argmax(1) == y).sum()\n" in out
    assert "        hits = int(hits)\n" in out
    assert "loss_sum += torch.nn.functional.cross_entropy(out, y, reduction='sum').item()" in out
    assert "loss_sum = float(loss_sum)" not in out


def test_accumulator_printed_raw_is_left_alone():
    source = """
    import torch

    def train(model, loader, optimizer):
        total = 0.0
        for x, y in loader:
            loss = model(x, y)
            loss.backward()
            optimizer.step()
            total += loss.item()
            history.append(total)
        return total
    """
    result = fix(source)
    assert "total += loss.item()" in result.source
    (finding,) = [f for f in result.remaining if f.code == "TX401"]
    assert "not fixed" in finding.message and "history.append" in finding.message


def test_code_outside_a_step_is_not_touched():
    source = """
    import torch

    def summary(losses):
        total = 0.0
        for t in losses:
            total += t.item()
            print(t.item())
            if t.item() > 1:
                break
        return total
    """
    result = fix(source)
    assert not result.changed
    assert not [f for f in result.remaining if f.code.startswith("TX4")]


COUNT_AFTER_LOOP = """
import torch

@torch.no_grad()
def evaluate(model, loader):
    {init}
    for x, y in loader:
        pred = model(x).argmax(dim=1)
        correct += (pred == y).sum().item()
        seen += y.size(0)
    return correct / seen
"""


def test_a_count_started_in_a_multiple_assignment_is_read_back_with_int():
    # `correct, seen = 0, 0` / `correct = seen = 0` / `correct: int = 0` start the count at an
    # int literal as `correct = 0` does: int() gives what .item() gave, and 0 after no batches
    for init in ("correct, seen = 0, 0", "seen, correct = (0, 0)", "correct = seen = 0",
                 "[correct, seen] = [0, 0]", "seen = 0; correct: int = 0"):
        out = fix(COUNT_AFTER_LOOP.format(init=init), unsafe=False).source
        assert "correct += (pred == y).sum()\n" in out, init
        assert "    correct = int(correct)\n" in out and "isinstance" not in out, (init, out)


def test_a_count_unpacked_from_a_call_keeps_the_type_test():
    # `correct, seen = start()`: the code does not show correct's type after no batches
    out = fix(COUNT_AFTER_LOOP.format(init="correct, seen = start()"), unsafe=False).source
    assert "correct += (pred == y).sum()\n" in out
    assert "if isinstance(correct, torch.Tensor):" in out and "int(correct)" not in out
    out = fix(COUNT_AFTER_LOOP.format(init="correct, *rest = 0, 0, 0; seen = 0"), unsafe=False).source
    assert "int(correct)" not in out


@pytest.mark.parametrize("helper,call", [
    ("def accuracy(out, y):\n    return (out.argmax(1) == y).float().mean().item()\n", "accs.append(accuracy(out, y))"),
    ("def grad_norm(model):\n    return sum(p.grad.norm().item() ** 2 for p in model.parameters()) ** 0.5\n",
     "gn = grad_norm(model)"),
    ("def to_list(t):\n    return t.detach().cpu().tolist()\n", "history.extend(to_list(out))"),
])
def test_a_helper_that_reads_on_the_host_is_reported_where_the_step_calls_it(helper, call):
    src = (f"import torch\n\n\n{helper}\n\nfor x, y in loader:\n    out = model(x)\n"
           f"    loss = F.cross_entropy(out, y)\n    loss.backward()\n    opt.step()\n    {call}\n")
    found = [f for f in engine.fix(src, engine.Options(tuple(registry.rules_for("torch-xla")))).remaining
             if f.code == "TX403"]
    name = helper.split("(")[0][4:]
    assert [f.message.split(" reads")[0] for f in found] == [f"`{name}()`"], found
    # outside a step: nothing
    outside = f"import torch\n\n\n{helper}\n\nprint({call.split('(', 1)[1].rsplit(')', 1)[0] if '=' not in call else 'x'})\n"
    assert not [f for f in engine.fix(outside, engine.Options(tuple(registry.rules_for("torch-xla")))).remaining
                if f.code == "TX403"]
