from __future__ import annotations

from typing import Iterator, Optional, Sequence

import libcst as cst

from porter import astutil
from porter.astutil import children as _children
from porter.context import dotted_name
from porter.rules import Edit, Example, Fix, Rule, Severity

from ._amp_dist import RUNTIME_STARTING, has_star, source_of

_LAUNCH = ("torch_xla.launch", "torch_xla.torch_xla.launch", "torch_xla.distributed.xla_multiprocessing.spawn")
# the seeding calls the fix can move into the launched function
_SEEDS = ("torch_xla.manual_seed", "torch_xla.torch_xla.manual_seed", "torch_xla.core.xla_model.set_rng_state")


class RuntimeBeforeLaunch(Rule):
    """
    ## What it does
    Finds the calls that start the XLA runtime (`torch_xla.manual_seed`,
    `torch_xla.device()`, `torch_xla.device_count()`, `xm.xla_device()`, `xr.world_size()`,
    `xr.global_ordinal()`...) that run in the parent process before `torch_xla.launch(fn,
    ...)` (or `xmp.spawn`): earlier in the function that launches, or at the top level of the
    module (which runs at import).

    A seeding statement, `torch_xla.manual_seed(seed)`, is moved into the launched function
    (to the top of its body) when everything it reads reaches that function through the
    launch's `args=(...)`: `torch_xla.manual_seed(args.seed)` before
    `torch_xla.launch(worker, args=(cfg_a, args))` becomes `torch_xla.manual_seed(args.seed)`
    at the top of `def worker(index, cfg_a, args)` (the names renamed to the function's
    parameters). An enclosing `if args.seed is not None:` is copied with it (and goes from
    the parent when the seed was all it held). The other calls are
    reported: they need a value from the runtime, which only the launched processes may ask
    for (`xr.world_size()`, `torch_xla.device()` inside `fn`).

    ## Why
    Measured in torch_xla 2.9: any of these calls before `torch_xla.launch` initialises the
    PJRT runtime in the parent, and the launch then fails with "Runtime is already
    initialized". The GPU originals do the same with CUDA harmlessly (CUDA starts lazily and
    the spawned workers start their own), so the ported calls (TX108 and TX804 add
    `torch_xla.manual_seed`, TX104 maps `torch.cuda.device_count()`) land in the parent.

    ## Fix safety
    Safe: the parent's XLA generator is never used by the launched processes (each starts
    its own runtime, and `torch.manual_seed` in a parent does not reach spawned processes
    either), so seeding at the start of the launched function is what makes the workers
    follow the seed; code that calls the function directly, without a launch, gets the same
    seed at the same point before any device work. The seed is moved only when every name
    it reads is passed unchanged through `args=(...)`.
    """

    code = "TX708"
    name = "xla-runtime-before-launch"
    target = "torch-xla"
    summary = "calls that start the XLA runtime before torch_xla.launch make it fail: move them into the launched function"
    severity = Severity.ERROR
    needs_text = ("launch", "spawn")
    examples = [
        Example(
            """
            import torch
            import torch_xla

            def worker(index, world_size, args):
                model = build(args).to(torch_xla.device())

            def main(args):
                torch.manual_seed(args.seed)
                torch_xla.manual_seed(args.seed)
                torch_xla.launch(worker, args=(2, args))
            """,
            """
            import torch
            import torch_xla

            def worker(index, world_size, args):
                torch_xla.manual_seed(args.seed)
                model = build(args).to(torch_xla.device())

            def main(args):
                torch.manual_seed(args.seed)
                torch_xla.launch(worker, args=(2, args))
            """,
            title="the seed moves into the launched function",
        ),
        Example(
            '''
            import torch_xla
            import torch_xla.distributed.xla_multiprocessing as xmp

            def _mp_fn(rank, cfg):
                """Train on one device."""
                train(cfg)

            if __name__ == "__main__":
                flags = parse()
                if flags.seed is not None:
                    torch.manual_seed(flags.seed)
                    torch_xla.manual_seed(flags.seed)
                xmp.spawn(_mp_fn, args=(flags,))
            ''',
            '''
            import torch_xla
            import torch_xla.distributed.xla_multiprocessing as xmp

            def _mp_fn(rank, cfg):
                """Train on one device."""
                if cfg.seed is not None:
                    torch_xla.manual_seed(cfg.seed)
                train(cfg)

            if __name__ == "__main__":
                flags = parse()
                if flags.seed is not None:
                    torch.manual_seed(flags.seed)
                xmp.spawn(_mp_fn, args=(flags,))
            ''',
            title="xmp.spawn, a guarded seed, another parameter name",
        ),
        Example(
            """
            import torch_xla
            import torch_xla.runtime as xr

            def run(index, world_size):
                train(index, world_size)

            def main():
                world_size = torch_xla.device_count()
                torch_xla.launch(run, args=(world_size,))
            """,
            None,
            title="the device count is reported: ask xr.world_size() inside the launched function",
        ),
        Example(
            """
            import torch_xla
            import torch_xla.core.xla_model as xm

            device = xm.xla_device()

            def run(index):
                train(device)

            if __name__ == "__main__":
                torch_xla.launch(run)
            """,
            None,
            title="a device taken at import is reported",
        ),
    ]
    valid = [
        # inside the launched function
        "import torch_xla\ndef run(i, seed):\n    torch_xla.manual_seed(seed)\n    torch_xla.device()\n"
        "def main():\n    torch_xla.launch(run, args=(1,))\n",
        # after the launch has returned
        "import torch_xla\ndef main():\n    torch_xla.launch(run)\n    print(torch_xla.device_count())\n",
        # no launch in the file
        "import torch_xla\ntorch_xla.manual_seed(0)\ndevice = torch_xla.device()\n",
        # in the other branch of the launch
        "import torch_xla\ndef main(spawn):\n    if spawn:\n        torch_xla.launch(run)\n"
        "    else:\n        torch_xla.manual_seed(0)\n        run(0)\n",
    ]

    def visit_Module(self, node: cst.Module) -> None:
        functions = {s.name.value: s for s in node.body if isinstance(s, cst.FunctionDef)}
        launches: list[tuple[cst.Call, Optional[cst.FunctionDef]]] = []
        for scope in [node, *astutil.walk(node, into_functions=True)]:
            if scope is not node and not isinstance(scope, cst.FunctionDef):
                continue
            for n in _scope_nodes(scope):
                if isinstance(n, cst.Call) and self.ctx.qualname(n.func) in _LAUNCH:
                    launches.append((n, scope if isinstance(scope, cst.FunctionDef) else None))
        if not launches:
            return
        seen: set[int] = set()
        # top-level code runs at import, before any launch
        for n in _scope_nodes(node, until=None, skip_main_guard=True):
            if isinstance(n, cst.Call) and self.ctx.qualname(n.func) in RUNTIME_STARTING and id(n) not in seen:
                seen.add(id(n))
                self._report(n, None, None, None, functions)
        for launch, scope in launches:
            body = scope if scope is not None else node
            for n, path in _before(body, launch):
                if isinstance(n, cst.Call) and self.ctx.qualname(n.func) in RUNTIME_STARTING and id(n) not in seen:
                    seen.add(id(n))
                    self._report(n, path, launch, scope, functions)

    def _report(self, call: cst.Call, path: Optional[list], launch: Optional[cst.Call],
                scope: Optional[cst.FunctionDef], functions: dict) -> None:
        what = source_of(call.func)
        where = "before torch_xla.launch" if launch is not None else "at import, in the process that launches"
        fix = self._move_seed(call, path, launch, scope, functions) if launch is not None else None
        if fix is not None:
            self.report(call, f"{what}() {where} starts the XLA runtime in the parent and the launch fails "
                        "(\"Runtime is already initialized\"): moved into the launched function", fix)
            return
        self.report(
            call,
            f"{what}() {where} starts the XLA runtime in the parent process, and torch_xla.launch then "
            "fails (\"Runtime is already initialized\"): call it inside the launched function "
            "(there, xr.world_size() and torch_xla.device() give the world size and the device)",
        )

    def _move_seed(self, call, path, launch, scope, functions) -> Optional[Fix]:
        if self.ctx.qualname(call.func) not in _SEEDS or path is None:
            return None
        # path: the statements from the launching scope's body down to the call; the ifs that
        # also hold the launch are its own branch, the others guard the seed and move with it
        line = path[-1]
        if not (isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1
                and isinstance(line.body[0], cst.Expr) and line.body[0].value is call):
            return None
        common = [s for s in path[:-1] if _contains(s, launch)]
        guards = path[len(common):-1]
        if not all(isinstance(g, cst.If) for g in common):
            return None
        if not all(isinstance(g, cst.If) and g.orelse is None and isinstance(g.body, cst.IndentedBlock) for g in guards):
            return None
        if has_star(launch) or not launch.args or launch.args[0].keyword is not None:
            return None
        fn = launch.args[0].value
        worker = functions.get(fn.value) if isinstance(fn, cst.Name) else None
        if worker is None or not isinstance(worker.body, cst.IndentedBlock):
            return None
        params = [p.name.value for p in (*worker.params.posonly_params, *worker.params.params)]
        passed = astutil.arg(launch, "args", 1)
        elements = passed.value.elements if passed is not None and isinstance(passed.value, (cst.Tuple, cst.List)) else ()
        rename: dict[str, str] = {}
        for i, el in enumerate(elements):
            if isinstance(el, cst.StarredElement):
                break
            if isinstance(el.value, cst.Name) and i + 1 < len(params):
                rename.setdefault(el.value.value, params[i + 1])
        reads = [n for r in [call, *(g.test for g in guards)] for n in _read_names(r)]
        names = {n.value for n in reads}
        paths = {p for r in [call, *(g.test for g in guards)] for p in _read_paths(r)}
        if not names <= set(rename) or _rebound_after(scope if scope is not None else self.ctx.module, line, launch, paths):
            return None
        # what goes: the seed, and each guard around it that holds nothing else
        top = line
        for g in reversed(guards):
            if len(g.body.body) != 1:
                break
            top = g
        block = _block_holding(common[-1].body if common else (scope if scope is not None else self.ctx.module), top)
        if block is None or len(block) == 1:
            return None  # the block would be left empty
        renamer = _Rename({id(n) for n in reads}, rename)
        moved = line.visit(renamer).with_changes(leading_lines=())
        for g in reversed(guards):  # the guards move with it, holding only the seed
            moved = g.with_changes(test=g.test.visit(renamer), body=g.body.with_changes(body=[moved]), leading_lines=())
        # after the docstring and the global/nonlocal declarations
        head = [st for st in _leading(worker.body.body)]
        if head:
            insert = Edit(head[-1], astutil.insert_after([moved]))
        else:
            insert = Edit(worker.body.body[0], astutil.insert_before([moved]))
        return Fix((insert, Edit(top, cst.RemoveFromParent())))


def _leading(body) -> list:
    """The docstring and global/nonlocal statements that open a function body."""
    out = []
    for i, st in enumerate(body):
        if i == 0 and _is_docstring(st):
            out.append(st)
        elif isinstance(st, cst.SimpleStatementLine) and all(isinstance(b, (cst.Global, cst.Nonlocal)) for b in st.body):
            out.append(st)
        else:
            break
    return out


def _is_docstring(stmt: cst.CSTNode) -> bool:
    return (isinstance(stmt, cst.SimpleStatementLine) and isinstance(stmt.body[0], cst.Expr)
            and isinstance(stmt.body[0].value, (cst.SimpleString, cst.ConcatenatedString)))


class _Rename(cst.CSTTransformer):
    """Renames the given Name nodes (by identity) to the launched function's parameters."""

    def __init__(self, nodes: set[int], names: dict[str, str]) -> None:
        super().__init__()
        self.nodes = nodes
        self.names = names

    def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.Name:
        if id(original) in self.nodes:
            return updated.with_changes(value=self.names[original.value])
        return updated


def _read_names(expr: cst.CSTNode) -> Iterator[cst.Name]:
    """The Names an expression reads, apart from the callee of its top-level call (the seed
    function itself) and attribute names."""
    if isinstance(expr, cst.Call):
        for a in expr.args:
            yield from _read_names(a.value)
        return
    if isinstance(expr, cst.Attribute):
        yield from _read_names(expr.value)
        return
    if isinstance(expr, cst.Name):
        if expr.value not in ("None", "True", "False"):
            yield expr
        return
    for child in _children(expr):
        yield from _read_names(child)


def _read_paths(expr: cst.CSTNode) -> Iterator[str]:
    """The dotted paths an expression reads (``args.seed``, ``seed``), as _read_names finds
    their roots."""
    if isinstance(expr, cst.Call):
        for a in expr.args:
            yield from _read_paths(a.value)
        return
    if isinstance(expr, (cst.Attribute, cst.Name)):
        path = dotted_name(expr)
        if path is not None:
            if path not in ("None", "True", "False"):
                yield path
            return
        if isinstance(expr, cst.Attribute):
            yield from _read_paths(expr.value)
            return
    for child in _children(expr):
        yield from _read_paths(child)


def _rebound_after(scope: cst.CSTNode, line: cst.CSTNode, launch: cst.Call, paths: set[str]) -> bool:
    """Something the seed reads is assigned between the seed and the launch: the path itself,
    an attribute of it or what holds it (``args = ...`` or ``args.seed = ...`` for
    ``args.seed``; ``args.world_size = ...`` is not)."""
    started = False
    for n in _scope_nodes(scope):
        if n is line:
            started = True
        if n is launch:
            return False
        if started and isinstance(n, (cst.AssignTarget, cst.AugAssign, cst.AnnAssign)):
            target = n.target
            while isinstance(target, cst.Subscript):
                target = target.value
            written = dotted_name(target)
            if written is None:
                return True
            if any(written == p or p.startswith(written + ".") or written.startswith(p + ".") for p in paths):
                return True
    return False


def _block_holding(scope: cst.CSTNode, stmt: cst.CSTNode) -> Optional[Sequence]:
    """The statement list (of a block below ``scope``, or the module's) that holds ``stmt``."""
    for n in astutil.walk(scope):
        if isinstance(n, cst.Module):
            seq = n.body
        elif isinstance(n, cst.IndentedBlock):
            seq = n.body
        else:
            continue
        if any(s is stmt for s in seq):
            return seq
    return None


def _scope_nodes(scope: cst.CSTNode, until=None, skip_main_guard: bool = False) -> Iterator[cst.CSTNode]:
    """Nodes of a scope in source order, not descending into nested functions/classes (nor,
    with ``skip_main_guard``, into ``if __name__ == "__main__":``)."""
    stack = list(reversed(_children(scope.body if isinstance(scope, cst.FunctionDef) else scope)))
    while stack:
        n = stack.pop()
        yield n
        if isinstance(n, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
            continue
        if skip_main_guard and isinstance(n, cst.If) and "__main__" in source_of(n.test):
            continue
        stack.extend(reversed(_children(n)))


def _before(scope: cst.CSTNode, launch: cst.Call) -> Iterator[tuple[cst.CSTNode, list]]:
    """The nodes that run before ``launch`` in ``scope`` (source order, not into nested
    functions), each with the statements from the scope's body down to it."""
    found = False

    def visit(node: cst.CSTNode, path: list) -> Iterator[tuple[cst.CSTNode, list]]:
        nonlocal found
        for child in _children(node):
            if found:
                return
            if child is launch:
                found = True
                return
            if isinstance(child, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
                continue
            here = path + [child] if isinstance(child, cst.BaseStatement) else path
            yield child, here
            if isinstance(child, (cst.If, cst.Else)) and _contains(child, launch):
                # the branch holding the launch: the other branches do not run before it
                if isinstance(child, cst.If):
                    yield from visit(child.test, here)
                    branch = child.body if _contains(child.body, launch) else child.orelse
                else:
                    branch = child.body
                yield from visit(branch, here)
                return
            yield from visit(child, here)

    yield from visit(scope.body if isinstance(scope, cst.FunctionDef) else scope, [])


def _contains(node: cst.CSTNode, target: cst.CSTNode) -> bool:
    return any(n is target for n in astutil.walk(node))
