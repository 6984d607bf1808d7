"""A CUDA-only `if torch.cuda.is_available():` whose every statement another rule removes
(backend flags, cache calls) goes whole in the default torch-xla port: no `pass` is left
where the block keeps other statements, one stays where the block would be empty."""
import textwrap

import pytest

from porter import engine, registry

SAFE = engine.Options(registry.select("torch-xla"), unsafe_fixes=False)

BODIES = {
    "cudnn flags": "torch.backends.cudnn.benchmark = True; torch.backends.cudnn.deterministic = False",
    "tf32 matmul": "torch.backends.cuda.matmul.allow_tf32 = True",
    "cache call": "torch.cuda.empty_cache()",
    "cudnn alias": "cudnn.benchmark = True",
}


def port(source: str) -> str:
    result = engine.fix(textwrap.dedent(source), SAFE, "train.py")
    assert result.changed
    return result.source


@pytest.mark.parametrize("body", BODIES.values(), ids=BODIES.keys())
def test_the_branch_goes_without_a_pass(body):
    out = port(f"""
        import torch
        import torch.backends.cudnn as cudnn


        def main(args):
            setup(args)
            if torch.cuda.is_available():
                {body}
            train(args)
        """)
    assert "pass" not in out and "is_available" not in out
    assert "    setup(args)\n    train(args)\n" in out


@pytest.mark.parametrize("body", BODIES.values(), ids=BODIES.keys())
def test_a_block_left_empty_keeps_one_pass(body):
    out = port(f"""
        import torch
        import torch.backends.cudnn as cudnn


        def configure():
            if torch.cuda.is_available():
                {body}
        """)
    assert "def configure():\n    pass\n" in out
