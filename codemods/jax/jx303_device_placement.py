from __future__ import annotations

from typing import Optional

import libcst as cst

from porter import astutil
from porter.rules import Example, Fix, Rule, Safety, Severity

from . import _loop as lp
from . import _ops_table as ops


class DevicePlacement(Rule):
    """
    ## What it does
    Removes explicit device placement:
    - `x.to(device)`, `x.to("cuda")`, `x.cuda()` (with or without `non_blocking=`) on a batch
      that a `for` loop reads from a data loader becomes `x.numpy()`: the torch tensors the
      loader yields are handed to JAX as NumPy arrays (a jitted step rejects torch tensors);
    - the elements of a batch moved one by one (`x, y = (t.to(device) for t in batch)`, a list
      comprehension too) become `np.asarray(t)`;
    - a tensor of the torch input pipeline read outside it (`model(images[:8].to(device))`,
      `images` given to a TensorDataset: a fixed batch of samples) becomes `images[:8].numpy()`;
    - on anything else (`model.to(device)`, `criterion.cuda()`, a freshly built array) the
      call goes and the receiver stays; a `net.to(device)` statement goes whole;
    - a batch of a torch `DataLoader` that the loop never moves (`for i, (x, y) in
      enumerate(loader)` with no `.to(device)`) becomes a NumPy array where the loop body
      begins (`x, y = x.numpy(), y.numpy()`); a single batch name the body indexes or unpacks
      (a list of tensors) stays as it is;
    - a batch that is no for loop's target becomes a NumPy array on the line after the
      statement that binds it: `x, y = next(iter(loader))` (the one-batch overfit), `batch =
      next(it)` for `it = iter(loader)` (a `while` loop, a `try: ... except StopIteration`
      refill), the parts of a single batch name (`x, y = batch`, `x, y = batch[0], batch[1]`,
      `x = batch["image"]`); a single batch name given to a function (or a method of the same
      class, `self.train_step(batch)`) that takes it apart stays, and the parts become NumPy
      arrays there (`np.asarray`: the function's other callers may give it arrays);
    - a sample collated by torch for a model call
      (`net(torch.utils.data.default_collate([ds[0]])[0])`, a dry forward that gives lazy
      layers their shapes) is handed over as a NumPy array (`.numpy()`);
    - an `if` whose branches only place on a device (`if use_cuda: model.cuda()`, `if args.cuda:
      data, target = data.cuda(), target.cuda()`), under a condition that only reads, goes
      whole: on every path the port has nothing left to do there (the batches become NumPy
      arrays where the loop body begins, as for a loop that never moves them);
    - `device = torch.device(...)` goes when nothing else in the file reads `device` any
      more, and so does a trainer's `self.device = next(model.parameters()).device` (a
      tensor's device) when no code reads that attribute any more; where the name is still passed around (a `train(model, device, ...)` parameter)
      the assignment stays and is reported.

    ## Why
    JAX places arrays itself: computations run on the default device (the TPU on a TPU VM)
    and inputs passed to a jitted function are transferred there. There is no per-tensor or
    per-module device to set.

    ## Fix safety
    Safe: the data and the model are the same; only where they live is left to JAX.
    """

    code = "JX303"
    name = "jax-device-placement"
    target = "jax"
    summary = "x.to(device) / .cuda() / model.to(device) / device = torch.device(...) removed; loader batches -> .numpy()"
    severity = Severity.WARNING
    needs_text = (".to(", ".cuda(", "torch.device", "current_accelerator", "default_collate", "DataLoader", "DataParallel", ".device",
                  "is_available", "device_count")
    examples = [
        Example(
            """
            import torch

            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            model = Net().to(device)
            model = model.to(device)
            criterion = torch.nn.MSELoss().cuda()
            for batch_idx, (data, target) in enumerate(train_loader):
                data = data.to(device)
                target = target.to(device, non_blocking=True)
                noise = torch.randn(4, 8).to(device)
                step(model, data, target, noise)
            model.to(device)
            """,
            """
            import torch
            model = Net()
            criterion = torch.nn.MSELoss()
            for batch_idx, (data, target) in enumerate(train_loader):
                data = data.numpy()
                target = target.numpy()
                noise = torch.randn(4, 8)
                step(model, data, target, noise)
            """,
            title="batches from a loader become NumPy arrays; other moves go",
        ),
        Example(
            """
            import torch

            def main(args):
                device = torch.device("cuda")
                train(model, device, loader)
            """,
            None,
            title="a device still passed around is reported",
        ),
        Example(
            """
            import torch
            import torch.utils.data


            def main(net, train_data, device):
                net.eval()
                net(torch.utils.data.default_collate([train_data.dataset[0]])[0])
                net.train()
                net.to(device)
            """,
            """
            import torch
            import torch.utils.data


            def main(net, train_data, device):
                net.eval()
                net(torch.utils.data.default_collate([train_data.dataset[0]])[0].numpy())
                net.train()
            """,
            title="a model's dry forward on a sample collated by torch; a bare net.to(device) goes",
        ),
        Example(
            """
            import torch
            from torch.utils.data import DataLoader

            loader = DataLoader(train_set, batch_size=8, shuffle=True)
            test_loader = torch.utils.data.DataLoader(test_set, batch_size=8)
            for epoch in range(2):
                for i, (images, labels) in enumerate(loader):
                    # flatten the images
                    images = images.reshape(-1, 784)
                    step(model, images, labels)
            for features, _ in test_loader:
                print(model(features))
            for batch in test_loader:
                step(model, batch)
            for batch in test_loader:
                x, y = batch
            """,
            """
            import torch
            from torch.utils.data import DataLoader

            loader = DataLoader(train_set, batch_size=8, shuffle=True)
            test_loader = torch.utils.data.DataLoader(test_set, batch_size=8)
            for epoch in range(2):
                for i, (images, labels) in enumerate(loader):
                    images, labels = images.numpy(), labels.numpy()
                    # flatten the images
                    images = images.reshape(-1, 784)
                    step(model, images, labels)
            for features, _ in test_loader:
                features = features.numpy()
                print(model(features))
            for batch in test_loader:
                batch = batch.numpy()
                step(model, batch)
            for batch in test_loader:
                x, y = batch
            """,
            title="batches a loop never moves to a device (enumerate, a tuple, a single tensor) become NumPy arrays "
                  "where the body begins; a batch the body unpacks (a list of tensors) stays",
        ),
        Example(
            """
            import torch
            from torch.utils.data import DataLoader


            def train_step(model, batch):
                inputs, targets = batch
                return step(model, inputs, targets)


            def main(model, train_set, device):
                loader = DataLoader(train_set, batch_size=8)
                x, y = next(iter(loader))
                x = x.to(device)
                overfit(model, x, y)
                it = iter(loader)
                while True:
                    try:
                        batch = next(it)
                    except StopIteration:
                        it = iter(loader)
                        batch = next(it)
                    images, labels = batch[0], batch[1]
                    step(model, images, labels)
                for batch in loader:
                    train_step(model, batch)
            """,
            """
            import torch
            from torch.utils.data import DataLoader
            import numpy as np


            def train_step(model, batch):
                inputs, targets = batch
                inputs, targets = np.asarray(inputs), np.asarray(targets)
                return step(model, inputs, targets)


            def main(model, train_set, device):
                loader = DataLoader(train_set, batch_size=8)
                x, y = next(iter(loader))
                y = y.numpy()
                x = x.numpy()
                overfit(model, x, y)
                it = iter(loader)
                while True:
                    try:
                        batch = next(it)
                    except StopIteration:
                        it = iter(loader)
                        batch = next(it)
                    images, labels = batch[0], batch[1]
                    images, labels = images.numpy(), labels.numpy()
                    step(model, images, labels)
                for batch in loader:
                    train_step(model, batch)
            """,
            title="batches no for loop binds (next(iter(loader)), next(it) in a while loop, a batch taken apart, "
                  "a batch given to a function that takes it apart) become NumPy arrays after the line that binds them",
        ),
        Example(
            """
            import torch

            loader = torch.utils.data.DataLoader(train_set, batch_size=4)
            images, labels = next(iter(loader))
            show(images)
            print(" ".join(classes[labels[j]] for j in range(4)))
            for epoch in range(2):
                for i, data in enumerate(loader, 0):
                    inputs, labels = data
                    step(net, inputs, labels)
            """,
            """
            import torch

            loader = torch.utils.data.DataLoader(train_set, batch_size=4)
            images, labels = next(iter(loader))
            images, labels = images.numpy(), labels.numpy()
            show(images)
            print(" ".join(classes[labels[j]] for j in range(4)))
            for epoch in range(2):
                for i, data in enumerate(loader, 0):
                    inputs, labels = data
                    inputs, labels = inputs.numpy(), labels.numpy()
                    step(net, inputs, labels)
            """,
            title="a script that shows a batch before it trains: the batch a loop binds is converted where the loop "
                  "reads it, whatever the script did with the same names before",
        ),
        Example(
            """
            import torch

            use_cuda = torch.cuda.is_available()
            model = Net()
            if use_cuda:
                model.cuda()
            for data, target in loader:
                if use_cuda:
                    data, target = data.cuda(), target.cuda(non_blocking=True)
                step(model, data, target)
            if torch.cuda.device_count() > 1:
                model = torch.nn.DataParallel(model)
            """,
            """
            import torch

            use_cuda = torch.cuda.is_available()
            model = Net()
            for data, target in loader:
                data, target = data.numpy(), target.numpy()
                step(model, data, target)
            """,
            title="placement under a CUDA flag goes whole (a DataParallel wrap too); the batches still become NumPy arrays",
        ),
        Example(
            """
            import torch

            def main(args):
                use_cuda = not args.no_cuda and torch.cuda.is_available()
                multi_gpu = torch.cuda.device_count() > 1
                loader_kwargs = {"pin_memory": True} if args.pin else {}
                model = Net()
                if use_cuda:
                    model = model.cuda()
                if multi_gpu:
                    model = torch.nn.DataParallel(model)
                train(model, loader_kwargs)


            if __name__ == "__main__":
                on_gpu = torch.cuda.is_available()
                pin = torch.cuda.is_available()
                net = Net()
                if on_gpu:
                    net.cuda()
                main(parse_args(pin), net)
            """,
            """
            import torch

            def main(args):
                loader_kwargs = {"pin_memory": True} if args.pin else {}
                model = Net()
                train(model, loader_kwargs)


            if __name__ == "__main__":
                pin = torch.cuda.is_available()
                net = Net()
                main(parse_args(pin), net)
            """,
            title="a CUDA availability flag goes once the placement it chose has gone and nothing reads it; "
                  "a flag still read stays",
        ),
        Example(
            """
            import torch
            import torch.nn as nn

            class GPT(nn.Module):
                def forward(self, idx):
                    device = idx.device
                    b, t = idx.shape
                    return self.head(idx) + t

                def other(self, x):
                    device = x.device
                    return x.to(device)
            """,
            """
            import torch
            import torch.nn as nn

            class GPT(nn.Module):
                def forward(self, idx):
                    b, t = idx.shape
                    return self.head(idx) + t

                def other(self, x):
                    return x
            """,
            title="a tensor's device read into a name nothing uses any more goes",
        ),
    ]
    valid = [
        "import torch\nx = x.to(torch.float16)\n",
        "import torch\ny = x.to(device, torch.float16)\n",
    ]

    def visit_If(self, node: cst.If) -> None:
        # `if use_cuda: model.cuda()`, `if args.cuda: data, target = data.cuda(), target.cuda()`:
        # nothing is left to do in the port, on either path (batches become NumPy arrays where
        # the loop body begins, visit_For): the whole statement goes, not a branch of `pass`
        if not lp.placement_if(node, self.ctx) or lp.in_placement_if(self.ctx) or not lp.places(node, self.ctx):
            return
        # a loop's batch moved in it still becomes a NumPy array, now on every path
        kept = [line for line in map(self._batch_conversion, _lines(node.body)) if line is not None]
        if kept and self._step_pending():
            return
        if kept:
            kept[0] = kept[0].with_changes(leading_lines=node.leading_lines)
            edit = self.replace(node, cst.FlattenSentinel(kept))
        else:
            edit = self.remove(node)
        self.report(node, "only device placement under this condition: JAX places arrays and modules itself, "
                          "on every path (the statement goes; a batch it moved becomes a NumPy array)",
                    Fix((edit,), Safety.SAFE))

    def _batch_conversion(self, line: cst.SimpleStatementLine) -> "cst.SimpleStatementLine | None":
        """``x, y = x.cuda(), y.cuda()`` on a loop's batch -> ``x, y = x.numpy(), y.numpy()``; None for
        a statement that only places something else."""
        smalls = []
        for small in line.body:
            if not isinstance(small, cst.Assign):
                continue
            target, value = small.targets[0].target, small.value
            pairs = (list(zip(target.elements, value.elements)) if isinstance(target, cst.Tuple)
                     else [(None, value)])
            receivers = [lp.device_move(v.value if e is not None else v, self.ctx) for e, v in pairs]
            if not receivers or not all(r is not None and self._batch(r) for r in receivers):
                continue
            numpy = [cst.Call(cst.Attribute(r, cst.Name("numpy"))) for r in receivers]
            if isinstance(target, cst.Tuple):
                new_value = value.with_changes(elements=[
                    v.with_changes(value=n) for (_, v), n in zip(pairs, numpy)])
            else:
                new_value = numpy[0]
            smalls.append(small.with_changes(value=new_value))
        if not smalls:
            return None
        smalls[-1] = smalls[-1].with_changes(semicolon=cst.MaybeSentinel.DEFAULT)
        return cst.SimpleStatementLine(smalls)

    def visit_Call(self, node: cst.Call) -> None:
        receiver = lp.device_move(node, self.ctx)
        if receiver is None:
            tensors = [a.value for a in node.args if self._unmoved_pipeline_tensor(a.value)]
            if tensors and (lp.is_model(lp.code(node.func), self.ctx) or self._jax_call(node)):
                self._hand_over(tensors)  # `model(X)`: the pipeline's X, unmoved
            return
        if lp.in_placement_if(self.ctx):
            return
        stmt = self.ctx.parent.__class__ is cst.Assign and self.ctx.parent
        batch = self._batch(receiver)
        if stmt and len(stmt.targets) == 1 and lp.code(stmt.targets[0].target) == lp.code(receiver) and not batch:
            return  # the whole statement goes (visit_SimpleStatementLine)
        if isinstance(self.ctx.parent, cst.Expr) and isinstance(receiver, (cst.Name, cst.Attribute)):
            return  # `net.to(device)` as a statement: the statement goes (visit_SimpleStatementLine)
        if batch and self._step_pending():
            return
        if batch:
            new = cst.Call(cst.Attribute(receiver, cst.Name("numpy")))
            message = "a batch from the loader: JAX places arrays itself; hand the step a NumPy array"
        elif self._moved_in_comprehension(node, receiver):
            # `x, y = (t.to(device) for t in batch)`: the batch's tensors moved one by one
            np_ = self.ctx.module_alias("numpy")
            self.report(node, "data moved to the device element by element: JAX places arrays itself; hand the step "
                              "NumPy arrays",
                        Fix((self.replace(node, cst.parse_expression(f"{np_}.asarray({lp.code(receiver)})")),),
                            Safety.SAFE, imports=("numpy",)))
            return
        elif self._moved_together():
            # `x, y = x.to(self.rank), y.to(self.rank)` outside model code: a batch handed in
            # (a trainer's `train_step(self, batch)`): a NumPy array for the jitted step, whatever
            # it was (np.asarray takes torch CPU tensors, NumPy and JAX arrays alike)
            np_ = self.ctx.module_alias("numpy")
            self.report(node, "data moved to the device: JAX places arrays itself; hand the step a NumPy array",
                        Fix((self.replace(node, cst.parse_expression(f"{np_}.asarray({lp.code(receiver)})")),),
                            Safety.SAFE, imports=("numpy",)))
            return
        elif self._pipeline_tensor(receiver):
            # `model(images[:8].to(device))`: a tensor of the torch input pipeline read outside it
            # (a fixed batch of samples) is still a torch tensor: JAX takes a NumPy array
            new = cst.Call(cst.Attribute(astutil.parenthesized(receiver), cst.Name("numpy")))
            message = "a tensor of the torch input pipeline moved to the device: hand JAX a NumPy array"
        else:
            new = receiver
            message = "JAX places arrays and modules itself: no explicit device move"
        self.report(node, message, Fix((self.replace(node, new),), Safety.SAFE))

    def visit_Comparison(self, node: cst.Comparison) -> None:
        # `model(X).argmax(1) == y`: the pipeline's y meets an array of the port
        self._meeting((node.left, *(c.comparator for c in node.comparisons)))

    def visit_BinaryOperation(self, node: cst.BinaryOperation) -> None:
        self._meeting((node.left, node.right))

    def _meeting(self, operands) -> None:
        tensors = [o for o in operands if self._unmoved_pipeline_tensor(o)]
        if tensors and any(self._jax_value(o) for o in operands if all(o is not t for t in tensors)):
            self._hand_over(tensors)

    def _unmoved_pipeline_tensor(self, value: cst.CSTNode) -> bool:
        """``value`` is a name the input pipeline's statements bind, or a subscript of one, and
        no function around it has a name of its own so spelled (the cheap test first: the
        pipeline's names are a fact of the pass)."""
        if not isinstance(value, (cst.Name, cst.Subscript)):
            return False
        root = lp.root_name(value)
        key = ("jx303.pipeline_names", id(self.ctx.module))
        names = self.ctx.cache.get(key)
        if names is None:
            ids = ops.data_node_ids(self.ctx)
            names = self.ctx.cache[key] = frozenset(
                name for n in astutil.walk(self.ctx.module, into_functions=True)
                if type(n) is cst.SimpleStatementLine and id(n) in ids for name in astutil.binds(n)) if ids else frozenset()
        if root not in names:
            return False
        if any(isinstance(a, cst.FunctionDef) and (astutil.has_param(a, root) or root in astutil.function_locals(a))
               for a in self.ctx.ancestors):
            return False  # a name of a function around it (the jitted step's own `data`), not the pipeline's
        return self._pipeline_tensor(value)

    def _hand_over(self, tensors) -> None:
        """Tensors of the torch input pipeline read as they are (``X``, ``X[160:]``: no move)
        where the port computes with JAX: NumPy arrays."""
        for value in tensors:
            numpy = cst.Call(cst.Attribute(astutil.parenthesized(value), cst.Name("numpy")))
            self.report(value, f"{lp.code(value)}: a tensor of the torch input pipeline, read where the port "
                               "computes with JAX: hand JAX a NumPy array", Fix((self.replace(value, numpy),), Safety.SAFE))

    def _jax_call(self, node: cst.Call) -> bool:
        return (self.ctx.qualname(node.func) or "").startswith(("jax.", "optax.", "flax."))

    def _jax_value(self, expr: cst.BaseExpression) -> bool:
        """``expr`` computes with the port's model or with JAX (a model call, a jnp call in it)."""
        return any(isinstance(n, cst.Call) and (self._jax_call(n) or lp.is_model(lp.code(n.func), self.ctx))
                   for n in astutil.walk(expr))

    def _pipeline_tensor(self, receiver: cst.BaseExpression) -> bool:
        """``receiver`` reads a name the input pipeline keeps torch (``images = torch.rand(...)``
        read by ``TensorDataset(images)``), outside the pipeline's own code."""
        root = astutil.root_name(receiver)
        if root is None or ops.in_data_pipeline(self.ctx):
            return False
        ids = ops.data_node_ids(self.ctx)
        fn = self.ctx.enclosing(cst.FunctionDef)
        for scope in ([fn.body] if fn is not None else []) + [self.ctx.module]:
            if any(type(n) is cst.SimpleStatementLine and id(n) in ids and root in astutil.binds(n)
                   for n in astutil.walk(scope)):
                return True
            if fn is not None and scope is fn.body and root in astutil.function_locals(fn):
                return False  # a local of the function, not the pipeline's
        return False

    def visit_For(self, node: cst.For) -> None:
        # a batch of a torch DataLoader that the loop never moves to a device is still a torch
        # tensor: it becomes a NumPy array where the loop body begins
        if not isinstance(node.body, cst.IndentedBlock) or not lp.imports_torch(self.ctx):
            return
        target = lp.loader_batch_target(node, self.ctx)
        if target is None or lp.has_backward(node.body, into_functions=True):
            return  # a training step still torch's: JX301 first (see _step_pending)
        names = _unconverted_batch(target, node, self.ctx)
        if not names:
            return
        imports: tuple[str, ...] = ()
        if isinstance(target, cst.Name) and _indexed_where_handed(target.value, node.body, self.ctx):
            # a dict or tuple of tensors indexed by the function it is given to (the jitted step
            # reads batch["x"]): each tensor becomes an array, the structure stays
            np_, jax_ = self.ctx.module_alias("numpy"), self.ctx.module_alias("jax")
            new = cst.parse_statement(f"{target.value} = {jax_}.tree.map({np_}.asarray, {target.value})\n")
            imports = ("numpy", "jax")
        else:
            new = cst.parse_statement(f"{', '.join(names)} = {', '.join(n + '.numpy()' for n in names)}\n")
        # a callable: another rule's edit of the same body (the train step) is kept
        self.report(node, f"{', '.join(names)}: a batch of the torch DataLoader, a torch tensor: JAX takes NumPy "
                          "arrays (converted where the loop body begins)",
                    Fix((self.replace(node.body, lambda body: body.with_changes(body=[new, *body.body])),), Safety.SAFE,
                        imports=imports))

    def visit_Subscript(self, node: cst.Subscript) -> None:
        # `net(torch.utils.data.default_collate([ds[0]])[0])`: a sample batch collated by torch
        # on the host (a model's dry forward) is handed to the JAX model as a NumPy array
        if not isinstance(self.ctx.parent, cst.Arg) or not isinstance(node.value, cst.Call):
            return
        if self.ctx.qualname(node.value.func) != "torch.utils.data.default_collate":
            return
        if len(node.slice) != 1 or not isinstance(getattr(node.slice[0].slice, "value", None), cst.Integer):
            return
        self.report(node, "a batch collated by torch: hand the JAX model a NumPy array",
                    Fix((self.replace(node, cst.Call(cst.Attribute(node, cst.Name("numpy")))),), Safety.SAFE))

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        if lp.in_placement_if(self.ctx):
            return  # visit_If removes the whole statement
        binding = lp.batch_binding(self.ctx, node) if lp.imports_torch(self.ctx) else None
        if binding is not None:
            if not self._step_pending():
                self._convert_binding(node, binding)
            return
        if len(node.body) == 1 and isinstance(node.body[0], cst.Expr):
            receiver = lp.device_move(node.body[0].value, self.ctx)
            if receiver is not None and isinstance(receiver, (cst.Name, cst.Attribute)):
                # `net.to(device)` as a statement: nothing is left to do
                self.report(node, "JAX places modules itself: no explicit device move",
                            Fix((self.remove(node),), Safety.SAFE))
            return
        if len(node.body) != 1 or not isinstance(node.body[0], cst.Assign):
            return
        assign = node.body[0]
        if lp.data_parallel_wrap(assign, self.ctx):
            self.report(node, "nn.DataParallel splits batches over local GPUs: the port's jitted step runs on JAX's "
                              "default device (shard the batch over jax.devices() to use several)",
                        Fix((self.remove(node),), Safety.SAFE))
            return
        if (len(assign.targets) == 1 and isinstance(assign.value, cst.Attribute) and assign.value.attr.value == "device"
                and self._unread_self_attribute(assign.targets[0].target)):
            # `self.device = next(model.parameters()).device` in a trainer whose moves are gone
            self.report(node, f"`{lp.code(assign.targets[0].target)}` = a tensor's device, and nothing reads it any "
                              "more: JAX places arrays itself", Fix((self.remove(node),), Safety.SAFE))
            return
        if len(assign.targets) != 1 or not isinstance(assign.targets[0].target, cst.Name):
            return
        value = assign.value
        receiver = lp.device_move(value, self.ctx)
        if receiver is not None and lp.code(receiver) == lp.code(assign.targets[0].target) and not self._batch(receiver):
            # `net = net.to(device)`: nothing left to assign
            self.report(node, "JAX places modules itself: no explicit device move", Fix((self.remove(node),), Safety.SAFE))
            return
        name = assign.targets[0].target.value
        if isinstance(value, cst.Attribute) and value.attr.value == "device":
            # `device = idx.device` in model code: a JAX array has no .device attribute to read
            # (a tracer under jit has none); once nothing reads the name (the device= arguments
            # the op table drops), the line goes
            if self._unread(assign):
                self.report(node, f"`{name}` = a tensor's device: JAX places arrays itself (and a traced array has no "
                                  ".device)", Fix((self.remove(node),), Safety.SAFE))
            return
        if lp.availability_flag(value, self.ctx):
            # `use_cuda = not args.no_cuda and torch.cuda.is_available()`: once the placement it
            # chose is gone (the `if use_cuda:` blocks above), nothing reads it; a module-level
            # flag only in a script (a library's global may be imported elsewhere)
            script = self.ctx.enclosing(cst.FunctionDef) is not None or _has_main_guard(self.ctx.module)
            if script and self._unread(assign):
                self.report(node, f"`{name}` only asks whether CUDA is there, and nothing reads it any more: the JAX "
                                  "port has no CUDA to ask about", Fix((self.remove(node),), Safety.SAFE))
            return
        if not (isinstance(value, cst.Call) and self.ctx.qualname(value.func) in lp.DEVICE_CALLS):
            return
        uses = self._other_uses(name)
        if uses:
            self.report(node, f"`{name}` is a torch device, still passed to {', '.join(sorted(uses))}: JAX places "
                              "arrays itself; remove the parameter where it is only used for .to()",
                        severity=Severity.INFO)
            return
        self.report(node, "JAX places arrays itself: no device object", Fix((self.remove(node),), Safety.SAFE))

    def _convert_binding(self, node: cst.SimpleStatementLine, binding) -> None:
        """``x, y = next(iter(loader))``, ``batch = next(it)``, ``x, y = batch``: the torch tensors
        it binds become NumPy arrays on the next line (``np.asarray`` in a function given the
        batch by its callers, which may give it other arrays too)."""
        loop = self.ctx.enclosing(cst.For, cst.While)
        inside = loop is not None and any(n is loop for n in astutil.walk(binding.scope, into_functions=False))
        names = _unconverted(binding, self.ctx, loop.body if inside else None)
        if not names:
            return
        if binding.handed:
            np_ = self.ctx.module_alias("numpy")
            values, imports = [f"{np_}.asarray({n})" for n in names], ("numpy",)
        else:
            values, imports = [f"{n}.numpy()" for n in names], ()
        new = cst.parse_statement(f"{', '.join(names)} = {', '.join(values)}\n")
        self.report(node, f"{', '.join(names)}: a batch of the torch DataLoader, torch tensors: JAX takes NumPy arrays "
                          "(converted on the next line)",
                    Fix((self.replace(node, astutil.insert_after([new])),), Safety.SAFE, imports=imports))

    def _unread(self, assign: cst.Assign) -> bool:
        """Nothing in the assignment's scope (its function, with the functions inside it, or the
        module) reads the name it binds (attribute names and keywords of the same spelling aside)."""
        target = assign.targets[0].target
        fn = self.ctx.enclosing(cst.FunctionDef)
        nodes = list(astutil.walk(fn.body if fn is not None else self.ctx.module, into_functions=True))
        attrs = {id(n.attr) for n in nodes if isinstance(n, cst.Attribute)}
        attrs |= {id(n.keyword) for n in nodes if isinstance(n, cst.Arg) and n.keyword is not None}
        return not any(isinstance(n, cst.Name) and n.value == target.value and id(n) not in attrs and n is not target
                       for n in nodes)

    def _unread_self_attribute(self, target: cst.BaseExpression) -> bool:
        """``target`` is ``self.<attr>`` in a method of a class, and no code of the class (nor of
        the file: an instance's attribute read from outside) reads ``<x>.<attr>`` otherwise (``x`` a
        name or an attribute path; ``next(model.parameters()).device`` is the value, no read)."""
        if not (isinstance(target, cst.Attribute) and isinstance(target.value, cst.Name) and target.value.value == "self"
                and self.ctx.enclosing(cst.ClassDef) is not None):
            return False
        attr = target.attr.value
        return not any(isinstance(n, cst.Attribute) and n.attr.value == attr and n is not target
                       and isinstance(n.value, (cst.Name, cst.Attribute))
                       for n in astutil.walk(self.ctx.module, into_functions=True))

    def _moved_in_comprehension(self, node: cst.Call, receiver: cst.BaseExpression) -> bool:
        """The call moves a comprehension's own variable (``[t.to(device) for t in batch]``,
        ``(t.cuda() for t in (x, y))``), outside a module class: the elements of a batch."""
        anc = self.ctx.ancestors
        comp = anc[-2] if len(anc) >= 2 else None
        if not isinstance(comp, (cst.ListComp, cst.GeneratorExp)) or comp.elt is not node \
                or not isinstance(receiver, cst.Name) or comp.for_in.inner_for_in is not None:
            return False
        if receiver.value not in astutil.target_names(comp.for_in.target) or self._step_pending():
            return False
        cls = self.ctx.enclosing(cst.ClassDef)
        return cls is None or not ops.is_module_class(cls, self.ctx)

    def _moved_together(self) -> bool:
        """The call is one of several names' moves in one statement (``x, y = x.cuda(), y.cuda()``),
        none of them a model, outside a module class: data."""
        anc = self.ctx.ancestors
        if len(anc) < 4 or not isinstance(anc[-3], cst.Tuple) or not isinstance(anc[-4], cst.Assign):
            return False
        assign = anc[-4]
        if assign.value is not anc[-3] or len(anc[-3].elements) < 2 or not lp.placement_only(assign, self.ctx):
            return False
        modules = lp.file_facts(self.ctx).modules
        if any(lp.code(e.value) in modules for e in assign.targets[0].target.elements):
            return False
        cls = self.ctx.enclosing(cst.ClassDef)
        return cls is None or not ops.is_module_class(cls, self.ctx)

    def _step_pending(self) -> bool:
        """A loop around the node still calls ``backward()``: its training step is torch's until
        JX301 rewrites it into a jitted step, and its batches stay torch tensors until then (the
        next pass converts them). A step JX301 cannot rewrite (reported there, and by JX901 at
        the ``backward()``) keeps torch batches, which the torch code left in it takes."""
        return any(isinstance(a, (cst.For, cst.While)) and lp.has_backward(a.body, into_functions=True)
                   for a in self.ctx.ancestors)

    def _batch(self, receiver) -> bool:
        """A batch a for loop around the node reads from its iterable (not a model)."""
        root = lp.root_name(receiver)
        return root is not None and (root in lp.loop_targets(self.ctx) or root in lp.bound_batch_names(self.ctx)) \
            and root not in lp.file_facts(self.ctx).modules

    def _other_uses(self, name: str) -> set[str]:
        """Where ``name`` is read other than as the device of a move this rule removes."""
        key = ("jx303.uses", name)
        if key in self.ctx.cache:
            return self.ctx.cache[key]
        skip: set[int] = set()
        uses: set[str] = set()
        for node in astutil.walk(self.ctx.module, into_functions=True):
            if isinstance(node, cst.Call) and lp.device_move(node, self.ctx) is not None:
                for a in node.args:
                    for n in astutil.walk(a):
                        skip.add(id(n))
            if isinstance(node, cst.Assign):
                for t in node.targets:
                    for n in astutil.walk(t.target):
                        skip.add(id(n))
        for node in astutil.walk(self.ctx.module, into_functions=True):
            if isinstance(node, cst.Call):
                for a in node.args:
                    if id(a.value) in skip:
                        continue
                    for n in astutil.walk(a.value):
                        if isinstance(n, cst.Name) and n.value == name and id(n) not in skip:
                            uses.add(lp.code(node.func))
            elif isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name) and node.value.value == name:
                uses.add(lp.code(node))
        self.ctx.cache[key] = uses
        return uses


def _unconverted_batch(target, loop: cst.For, ctx) -> list[str]:
    """The batch names of ``target`` that the loop body reads as torch tensors: not moved to
    a device (that move becomes ``.numpy()``), not converted already (``x.numpy()``,
    ``np.asarray(x)``), not ``_``. A single name is taken only when the body neither indexes,
    unpacks nor iterates it (a list of tensors otherwise)."""
    if isinstance(target, cst.Name):
        candidates = [target.value]
        single = True
    elif isinstance(target, (cst.Tuple, cst.List)):
        candidates = [e.value.value for e in target.elements if isinstance(e.value, cst.Name)]
        single = False
    else:
        return []
    candidates = [n for n in candidates if n != "_" and not n.startswith("_")]
    if single and candidates and lp.handed_over(ctx, ctx.enclosing(cst.FunctionDef) or ctx.module, candidates[0]):
        return []  # given to a function of the file that unpacks it: converted there
    if single and candidates and _taken_as_a_list(loop.body, candidates[0]):
        return []
    read, handled = _reads_and_conversions(loop.body, ctx)
    return [n for n in candidates if n in read and n not in handled]


def _indexed_where_handed(name: str, body: cst.CSTNode, ctx, depth: int = 0) -> bool:
    """``body`` gives ``name`` whole to a function of the file (the jitted step JX301 wrote)
    that indexes the parameter taking it (``batch["x"]``, ``batch[0]``), itself or through the
    functions it gives it to (a loss helper): a dict or tuple of tensors."""
    if depth > 3:
        return False
    functions = {s.name.value: s for s in ctx.module.body if isinstance(s, cst.FunctionDef)}
    for call in (n for n in astutil.walk(body, into_functions=True) if isinstance(n, cst.Call)):
        fn = functions.get(call.func.value) if isinstance(call.func, cst.Name) else None
        if fn is None:
            continue
        params = [p.name.value for p in astutil.params(fn.params)]
        for i, a in enumerate(call.args):
            if not (isinstance(a.value, cst.Name) and a.value.value == name) or a.star:
                continue
            param = a.keyword.value if a.keyword is not None else params[i] if i < len(params) else None
            if param is not None and (any(isinstance(n, cst.Subscript) and isinstance(n.value, cst.Name)
                                          and n.value.value == param for n in astutil.walk(fn.body, into_functions=True))
                                      or _indexed_where_handed(param, fn.body, ctx, depth + 1)):
                return True
    return False


def _taken_as_a_list(body: cst.CSTNode, name: str) -> bool:
    """``body`` (nested functions aside) indexes ``name``, assigns it whole (``x, y = batch``) or
    iterates it (``x, y = (t.to(device) for t in batch)``): a list of tensors, not one tensor."""
    for n in astutil.walk(body, into_functions=False):
        if isinstance(n, cst.Subscript) and isinstance(n.value, cst.Name) and n.value.value == name:
            return True
        if isinstance(n, cst.Assign) and isinstance(n.value, cst.Name) and n.value.value == name:
            return True
        if isinstance(n, (cst.CompFor, cst.For)) and isinstance(n.iter, cst.Name) and n.iter.value == name:
            return True
    return False


def _reads_and_conversions(body: cst.CSTNode, ctx, skip: Optional[cst.CSTNode] = None) -> tuple[set, set]:
    """(names ``body`` reads, names it moves to a device or converts to arrays already:
    ``x.to(device)``, ``x.numpy()``, ``np.asarray(x)``, ``jax.tree.map(np.asarray, batch)``),
    nested functions and ``skip`` aside."""
    read: set[str] = set()
    handled: set[str] = set()
    skipped = {id(n) for n in astutil.walk(skip)} if skip is not None else set()
    for n in astutil.walk(body, into_functions=False):
        if id(n) in skipped:
            continue
        if isinstance(n, cst.Name):
            read.add(n.value)
        if isinstance(n, cst.Call):  # a move in a placement `if` too: JX303 makes it unconditional
            receiver = lp.device_move(n, ctx)
            if receiver is not None and lp.root_name(receiver) is not None:
                handled.add(lp.root_name(receiver))
            if astutil.method_name(n) == "numpy" and isinstance(n.func, cst.Attribute):
                root = lp.root_name(n.func.value)
                if root is not None:
                    handled.add(root)
            qual = ctx.qualname(n.func) or ""
            if qual in _ARRAY_MAKERS:
                for a in n.args:
                    if isinstance(a.value, cst.Name):
                        handled.add(a.value.value)
            # jax.tree.map(np.asarray, batch): every tensor of a dict or tuple batch
            if qual in ("jax.tree.map", "jax.tree_util.tree_map") and n.args and ctx.qualname(n.args[0].value) in _ARRAY_MAKERS:
                handled.update(a.value.value for a in n.args[1:] if isinstance(a.value, cst.Name))
    return read, handled


_ARRAY_MAKERS = ("numpy.asarray", "numpy.array", "jax.numpy.asarray", "jax.numpy.array")


def _unconverted(binding, ctx, region: Optional[cst.CSTNode] = None) -> list[str]:
    """The names of a batch binding its scope reads as torch tensors (as _unconverted_batch: a
    single name only where the scope neither indexes, unpacks nor iterates it nor hands it to a function
    that does). ``region``: the body of the loop that binds the batch, where its reads and
    conversions are looked for (a conversion of the same name elsewhere in a script, `images,
    labels = images.numpy(), labels.numpy()` of a batch shown before training, converts
    another value)."""
    body = binding.scope.body if isinstance(binding.scope, cst.FunctionDef) else binding.scope
    value = binding.stmt.body[0].value if isinstance(binding.stmt, cst.SimpleStatementLine) else None
    if isinstance(value, (cst.GeneratorExp, cst.ListComp)) and _converts(value.elt, ctx):
        return []  # `x, y = (t.to(device) for t in batch)`: each element moved (a NumPy array) as it is taken
    names = [n for n in binding.names if n != "_" and not n.startswith("_")]
    if len(binding.names) == 1 and names:
        name = names[0]
        if lp.handed_over(ctx, binding.scope, name) or _taken_as_a_list(body, name):
            return []
    # the reads after the binding (on the following lines: a statement's own names aside)
    read, handled = _reads_and_conversions(region if region is not None else body, ctx, skip=binding.stmt)
    return [n for n in names if n in read and n not in handled]


def _converts(expr: cst.BaseExpression, ctx) -> bool:
    """``expr`` moves its value to a device (a NumPy array in the port) or converts it to one:
    ``t.to(device)``, ``t.cuda()``, ``t.numpy()``, ``np.asarray(t)``."""
    if not isinstance(expr, cst.Call):
        return False
    return (lp.device_move(expr, ctx) is not None or astutil.method_name(expr) == "numpy"
            or ctx.qualname(expr.func) in ("numpy.asarray", "numpy.array"))


def _has_main_guard(module: cst.Module) -> bool:
    """``if __name__ == "__main__":`` at the top level: a script."""
    return any(isinstance(stmt, cst.If) and "__main__" in astutil.code(stmt.test) and "__name__" in astutil.code(stmt.test)
               for stmt in module.body)


def _lines(block: cst.BaseSuite) -> list:
    if isinstance(block, cst.SimpleStatementSuite):
        return [cst.SimpleStatementLine(block.body)]
    return [s for s in block.body if isinstance(s, cst.SimpleStatementLine)]
