from __future__ import annotations


import libcst as cst

from porter import astutil, program
from porter.astutil import code as _code
from porter.rules import Edit, Example, Fix, Rule, Safety, Severity

from . import _loop as lp
from . import _nnx
from . import _ops_table as ops

# torch code a JAX port keeps on purpose: the host-side input pipeline (its batches cross into
# the jitted step as numpy arrays), seeding of that pipeline, and device checks that touch no
# JAX value
_HOST = ("torch.utils.data", "torchvision.datasets", "torchvision.transforms", "torchtext", "torchaudio.datasets",
         "torch.manual_seed", "torch.Generator", "torch.cuda.is_available", "torch.device", "torch.backends",
         "torch.accelerator",
         "torch.set_num_threads", "torch.get_num_threads", "torch.from_numpy")
# methods and attributes only torch objects have, reported wherever they are left
_TORCH_ONLY = {
    "backward": "the training step around it was not rewritten into a jitted nnx.value_and_grad step",
    "zero_grad": "an nnx.Optimizer / NNX module has no gradients to zero: the training step around it was not rewritten",
    "is_cuda": "JAX arrays have no is_cuda (jax.devices() / x.devices() say where they are)",
    "cuda": "JAX arrays and NNX modules have no .cuda(): JAX places arrays on the default device by itself",
    "requires_grad_": "JAX differentiates what nnx.grad / nnx.value_and_grad is given (wrt=), not flagged tensors",
    "register_hook": "JAX has no tensor hooks",
    "register_forward_hook": "NNX modules have no forward hooks",
    "named_parameters": "NNX modules have no named_parameters(): nnx.state(model, nnx.Param) holds them",
    "parameters": "NNX modules have no parameters(): jax.tree.leaves(nnx.state(model, nnx.Param)) are its arrays, "
                  "in NNX's order and layouts (a Linear's kernel is torch's weight transposed)",
    "modules": "NNX modules have no modules(): nnx.iter_modules(model) yields (path, module) pairs",
    "named_modules": "NNX modules have no named_modules(): nnx.iter_modules(model) yields (path, module) pairs",
    "children": "NNX modules have no children(): nnx.iter_children(m) yields its attributes that are modules, in "
                "attribute order, without the activations the port keeps as functions (torch's nn.ReLU children): "
                "build the sequence of layers by hand",
    "named_children": "NNX modules have no named_children(): nnx.iter_children(m) yields (name, module) of its "
                      "attributes that are modules, without the activations the port keeps as functions",
}
_ATTRIBUTES = ("is_cuda",)  # the others of _TORCH_ONLY are methods: reported where they are called
# methods and attributes of torch tensors that JAX arrays lack, reported on values the port computes in JAX
_TENSOR_ONLY = ("data", "grad", "cpu", "detach", "numpy", "to", "float", "long", "int", "double", "half", "dim",
                "contiguous", "type", "device_type")


class TorchLeft(Rule):
    """
    ## What it does
    Runs on what the other JAX rules leave (the findings porter reports are those of the
    last pass, once nothing else changes) and reports each piece of torch code still in the
    port, at its line, so that a port never fails with no finding that predicted it:

    - a `torch.*` / `torchvision.*` name still used (a function with no JAX translation,
      `isinstance(h, torch.Tensor)`, `torchvision.utils.save_image(...)` on a JAX array);
      type hints are not (`y: Optional[torch.Tensor]`, `Out.__annotations__ = {"a": Tensor}`);
      the host-side input pipeline (`torch.utils.data`, `torchvision.datasets` /
      `transforms`, `torch.manual_seed`, device checks) is not reported: its batches
      cross into the jitted step as numpy arrays;
    - a model a torch library builds (`torchvision.models.resnet18()`, `timm.create_model(...)`,
      `torch.hub.load(...)`, a `transformers` model's `from_pretrained`), reported where it is
      built: it stays a torch module, which nnx.Optimizer, `nnx.state` and the jitted step cannot
      train (the library's model code has to be ported too);
    - calls only torch objects have: `loss.backward()` / `optimizer.zero_grad()` left in a
      loop the training-step rules did not rewrite, `.cuda()`, `.is_cuda`,
      `.requires_grad_()`, hooks;
    - tensor attributes JAX arrays lack (`.data`, `.grad`, `.cpu()`, `.detach()`, `.numpy()`,
      `.size()`, ...) used on a value the port computes in JAX: the result of a jitted
      function, of an NNX model of the file, or of a `jax.*` / `jnp.*` call; and `x.data` given
      to a `jnp.*` operation (`jnp.equal(predicted, targets.data)`, from the original's
      `predicted.eq(targets.data)`), where `x` may be a numpy array of the batch, whose `.data`
      is its memory buffer;
    - torch's parameter names on an NNX layer of a module class of the port
      (`self.fc.weight` where `self.fc = nnx.Linear(...)`, an `nnx.Dict` entry
      `self.transformer.wte.weight`): the arrays are `kernel` (transposed), `embedding`,
      `scale`;
    - a batch of a torch `DataLoader` given to a jitted function as it comes (a torch tensor)
      instead of as numpy (`x = x.numpy()` at the boundary, as JX303 writes where the original
      moved the batch to a device).

    Only files that are ports (they import jax / flax / optax: the other rules' fixes add the
    imports) are read; in a torch file the other rules' own findings say what to port. Code
    inside the file's `torch.utils.data.Dataset` / `Sampler` classes is the input
    pipeline and not reported. A line another rule already marked `# porter: manual` is not
    reported again.

    Fixes: `outputs.data` on a JAX value becomes `outputs` (a JAX array is its own data);
    `isinstance(x, torch.Tensor)` becomes `isinstance(x, (torch.Tensor, jax.Array))` (a value of
    the input pipeline may still be a torch tensor, and the port's arrays stand for the
    original's tensors); `isinstance(x, nn.Parameter)` becomes `isinstance(x, jax.Array)`
    (unsafe).

    ## Why
    A JAX port with torch calls left in it fails when it runs (a torch function given a JAX
    array, an attribute JAX arrays do not have), often far from the line that needs a human.

    ## Fix safety
    `.data` removal: safe (`x.data` of a torch tensor is the same values without autograd
    history, which JAX arrays never have). `jax.Array` added to `torch.Tensor` in `isinstance`:
    safe (what passed still passes; a JAX array, the port's tensor, passes too).
    `nn.Parameter` -> `jax.Array`: unsafe. Everything else is reported only.
    """

    code = "JX901"
    name = "torch-left-in-jax-port"
    target = "jax"
    summary = "torch code left in the JAX port after the other rules (torch.* calls, .backward(), .cuda(), tensor attributes on JAX values): reported at its line"
    severity = Severity.ERROR
    needs_text = ("torch", "backward", "zero_grad", "cuda", ".data", ".grad", ".weight", ".bias",
                  "create_model", "from_pretrained", "from_config")
    examples = [
        Example(
            """
            import torch
            import jax.numpy as jnp

            def check(x):
                y = jnp.exp(x)
                return torch.max(y.data, 1)
            """,
            """
            import torch
            import jax.numpy as jnp

            def check(x):
                y = jnp.exp(x)
                return torch.max(y, 1)
            """,
            title=".data of a JAX value dropped; torch.max (no table entry for this call) reported",
        ),
        Example(
            """
            import jax.numpy as jnp

            def correct(outputs, targets, lam, mix):
                y_a, y_b = mix(targets)
                predicted = jnp.argmax(outputs, axis=1)
                return lam * jnp.equal(predicted, y_a.data).sum() + (1 - lam) * jnp.equal(predicted, y_b.data).sum()
            """,
            """
            import jax.numpy as jnp

            def correct(outputs, targets, lam, mix):
                y_a, y_b = mix(targets)
                predicted = jnp.argmax(outputs, axis=1)
                return lam * jnp.equal(predicted, y_a).sum() + (1 - lam) * jnp.equal(predicted, y_b).sum()
            """,
            title=".data of operands of jnp operations dropped (values a helper returns: numpy arrays of the "
                  "batch or JAX arrays)",
        ),
        Example(
            """
            import torch
            import jax.numpy as jnp

            def step(h):
                if isinstance(h, torch.Tensor):
                    h = jnp.tanh(h)
                return h
            """,
            """
            import torch
            import jax.numpy as jnp
            import jax

            def step(h):
                if isinstance(h, (torch.Tensor, jax.Array)):
                    h = jnp.tanh(h)
                return h
            """,
            title="isinstance(h, torch.Tensor) also holds for a JAX array (a recurrent state that "
                  "repackage_hidden detaches)",
        ),
        Example(
            """
            import torch
            import torchvision
            import optax
            import flax.nnx as nnx

            model = torchvision.models.resnet18(num_classes=10)
            optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
            for x, y in loader:
                optimizer.zero_grad()
                loss = loss_fn(model(x), y)
                loss.backward()
                if x.is_cuda:
                    print(loss.item())
            """,
            None,
            title="a torchvision model given to nnx.Optimizer, a loop that still calls backward(), is_cuda",
        ),
        Example(
            """
            import jax
            import flax.nnx as nnx
            from timm.models import create_model, safe_model_name
            from transformers import AutoModelForCausalLM, AutoTokenizer

            def build(args, device):
                model = create_model(args.model, pretrained=False, num_classes=10).to(device)
                print(safe_model_name(args.model))
                return model

            tokenizer = AutoTokenizer.from_pretrained("gpt2")
            lm = AutoModelForCausalLM.from_pretrained("gpt2")
            """,
            None,
            title="models timm and transformers build, reported where they are built (a tokenizer and a name helper are not)",
        ),
        Example(
            """
            import flax.nnx as nnx

            class LM(nnx.Module):
                def __init__(self, *, rngs: nnx.Rngs):
                    self.blocks = nnx.Dict(dict(wte=nnx.Embed(100, 16, rngs=rngs), ln=nnx.LayerNorm(16, rngs=rngs)))
                    self.head = nnx.Linear(16, 100, use_bias=False, rngs=rngs)
                    self.blocks.wte.weight = self.head.weight

                def norm_scale(self):
                    return self.blocks.ln.weight
            """,
            None,
            title="torch parameter names on NNX layers: a tied weight, an nnx.Dict entry",
        ),
    ]
    valid = [
        "import jax.numpy as jnp\nimages = jnp.asarray(train_set.data) / 255.0\n",  # a dataset's array, converted
        "import torch\nimport numpy as np\nloader = torch.utils.data.DataLoader(ds, batch_size=4)\ntorch.manual_seed(0)\n"
        "for x, y in loader:\n    x = x.numpy()\n    print(np.asarray(x).sum())\n",
        "import torch\nclass Data(torch.utils.data.Dataset):\n    def __getitem__(self, i):\n        return torch.tensor([i]).float()\n",
        # `nn` of `jax.nn.relu` is an attribute, not the file's torch `nn`
        "import jax\nfrom torch import nn\n\n\ndef act(x):\n    return jax.nn.relu(x) + jax.nn.sigmoid(x)\n",
        # type hints are not computed on
        "import jax\nfrom typing import Optional\nfrom collections import namedtuple\nimport torch\nfrom torch import Tensor\n"
        "Out = namedtuple('Out', ['a', 'b'])\nOut.__annotations__ = {'a': torch.Tensor, 'b': Optional[Tensor]}\n"
        "def f(x):\n    y: Optional[Tensor] = jax.numpy.exp(x)\n    return y\n",
    ]

    def visit_Module(self, node: cst.Module) -> None:
        ctx = self.ctx
        if not any(q.split(".")[0] in ("flax", "jax", "optax") for q in ctx.aliases.values()):
            return  # not a port (yet): the other rules' findings say what to port
        jitted = set(lp.jitted_functions(ctx))
        models = set(_nnx.module_classes(ctx))
        self._walk(node, jitted, models, skip=False)
        self._loader_batches(node, jitted)
        self._torch_parameter_names(node)

    def _torch_parameter_names(self, module: cst.Module) -> None:
        """`self.fc.weight` where `self.fc` is an NNX layer of a module class of the port: the
        NNX layer's arrays have other names (`kernel`, `embedding`, `scale`)."""
        for cls in module.body:
            if not isinstance(cls, cst.ClassDef):
                continue
            layers = lp.self_layer_kinds(cls, self.ctx)
            if not layers:
                continue
            for n in astutil.walk(cls, into_functions=True):
                if not isinstance(n, cst.Attribute) or n.attr.value not in ("weight", "bias"):
                    continue
                path = lp.dotted_name(n.value)
                kind = layers.get(path or "")
                kind = kind if kind in _NNX_NAMES else None
                new = _NNX_NAMES.get(kind, {}).get(n.attr.value) if kind else None
                if new is None or new == n.attr.value:
                    continue
                layout = " (kernel = weight.T: a weight shared with another layer needs a hand port, e.g. nnx.Embed.attend)" \
                    if new == "kernel" else ""
                self.report(n, f"{_code(n)}: {path} is an nnx.{kind}, whose array is .{new}, not .{n.attr.value}{layout}")

    def _loader_batches(self, module: cst.Module, jitted: set) -> None:
        """A batch of a torch DataLoader given to a jitted function as it comes (a torch tensor:
        jit cannot take it) rather than as numpy (`x = x.numpy()` first)."""
        if not jitted:
            return
        for loop in astutil.walk(module, into_functions=True):
            if not isinstance(loop, cst.For) or not lp.is_loader_expr(lp.strip_iter(loop.iter), self.ctx):
                continue
            batch = {n.value for n in astutil.walk(loop.target) if isinstance(n, cst.Name)}
            for stmt in _statements(loop):
                if _marked(stmt):
                    continue
                for n in _own_nodes(stmt):
                    if isinstance(n, cst.Call) and isinstance(n.func, cst.Name) and n.func.value in jitted:
                        for a in n.args:
                            if isinstance(a.value, cst.Name) and a.value.value in batch:
                                self.report(a.value, f"{a.value.value} is a batch of the torch DataLoader, still a torch "
                                                     f"tensor: {n.func.value} is jitted and takes numpy or JAX arrays "
                                                     f"({a.value.value} = {a.value.value}.numpy() before the call)")
                if isinstance(stmt, cst.SimpleStatementLine):
                    for small in stmt.body:
                        if isinstance(small, cst.Assign):
                            bound = {x.value for t in small.targets for x in astutil.walk(t.target) if isinstance(x, cst.Name)}
                            if any(isinstance(c, cst.Call) and (astutil.method_name(c) == "numpy" or (
                                    self.ctx.qualname(c.func) or "") in ("numpy.asarray", "numpy.array", "jax.numpy.asarray",
                                                                         "jax.numpy.array"))
                                   for c in astutil.walk(small.value)):
                                batch -= bound  # converted at the boundary
                            elif not any(isinstance(x, cst.Name) and x.value in batch for x in astutil.walk(small.value)):
                                batch -= bound  # rebound to something else
                            elif lp.root_name(small.value) in batch and isinstance(small.value, (cst.Name, cst.Subscript)):
                                batch |= bound  # unpacked from the batch (`x, y = batch`, `x = batch[0]`)

    # ------------------------------------------------------------------------------
    def _walk(self, root: cst.CSTNode, jitted: set, models: set, skip: bool) -> None:
        ctx = self.ctx
        data_functions = ops.data_function_names(ctx)
        for scope in _scopes(root, ctx):
            if isinstance(scope, cst.FunctionDef) and scope.name.value in data_functions:
                continue  # the torch input pipeline's own code (a collate_fn, a data maker)
            jax_names = _jax_values(scope, ctx, jitted, models)
            for stmt in _statements(scope):
                if _marked(stmt):
                    continue
                self._check_statement(stmt, jax_names, jitted, models)

    def _check_statement(self, stmt: cst.CSTNode, jax_names: set, jitted: set, models: set) -> None:
        ctx = self.ctx
        reported: set[int] = _type_hints(stmt)
        data = ops.data_node_ids(ctx)  # the torch input pipeline's own code stays torch
        if id(stmt) in data:
            return
        nodes = list(_own_nodes(stmt))
        called = {id(n.func) for n in nodes if isinstance(n, cst.Call)}
        operands = _array_operands(nodes, ctx)
        for n in nodes:  # torchvision's image helpers given a torch tensor of the port's array (JX318)
            if isinstance(n, cst.Call) and ctx.qualname(n.func) in lp.TORCH_IMAGE_UTILS and n.args and isinstance(
                    n.args[0].value, cst.Call) and ctx.qualname(n.args[0].value.func) in lp.HANDOVER:
                reported.update(id(m) for part in (n.func, n.args[0].value.func) for m in astutil.walk(part))
            # a random draw of torch's generator on the host, handed to JAX as an array (JX101's
            # form: the original's numbers for the same seed)
            if isinstance(n, cst.Call) and ctx.qualname(n.func) in ("numpy.asarray", "numpy.array") and n.args and \
                    isinstance(n.args[0].value, cst.Call) and ctx.qualname(n.args[0].value.func) in lp.HOST_DRAWS:
                reported.update(id(m) for m in astutil.walk(n.args[0].value.func))
        for n in nodes:
            if isinstance(n, (cst.Import, cst.ImportFrom)):
                return
            if id(n) in reported:
                continue
            if id(n) in data:  # an argument of TensorDataset(...) / DataLoader(...)
                reported.update(id(m) for m in astutil.walk(n))
                continue
            if isinstance(n, (cst.Assign, cst.AnnAssign)) and n.value is not None:
                factory = _nnx.library_model_factory(n.value, ctx)
                if factory:
                    reported.update(id(m) for m in astutil.walk(n.value))
                    library = factory.split(".")[0]
                    self.report(n.value, f"a torch module built by {factory}(...): the JAX port cannot train it "
                                         "(nnx.Optimizer, nnx.state and the jitted step take NNX modules); port the "
                                         f"model's code with it: `porter migrate SCRIPT --to jax --out DIR --with "
                                         f"{library}` writes the port of {library}'s model code beside the script, "
                                         "which builds its model from that when it calls the library's model classes "
                                         "or builders (measured on torchvision's; a registry such as timm's "
                                         "create_model is not followed), or port this script to torch-xla")
            if isinstance(n, cst.Call) and isinstance(n.func, cst.Name) and n.func.value == "isinstance" and len(n.args) == 2:
                kinds = n.args[1].value
                elts = [e.value for e in kinds.elements] if isinstance(kinds, cst.Tuple) else [kinds]
                jax_array = f"{ctx.module_alias('jax')}.Array"
                if any(_code(e) == jax_array for e in elts):
                    # the port's arrays pass already: torch.Tensor there is for the input pipeline
                    for e in elts:
                        if (ctx.qualname(e) or "") == "torch.Tensor":
                            reported.update(id(m) for m in astutil.walk(e))
                    elts = []
                for e in elts:
                    qual = ctx.qualname(e) or ""
                    if qual == "torch.Tensor":
                        reported.update(id(m) for m in astutil.walk(e))
                        added = cst.Element(cst.parse_expression(jax_array))
                        edit = (Edit(kinds, lambda t: t.with_changes(elements=[*t.elements[:-1], t.elements[-1].with_changes(
                                    comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))), added]))
                                if isinstance(kinds, cst.Tuple) else
                                Edit(e, cst.Tuple([cst.Element(e, comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))),
                                                   added])))
                        self.report(e, f"isinstance(..., {_code(e)}): the port's tensors are JAX arrays: "
                                       f"{jax_array} passes too", Fix((edit,), imports=("jax",)))
                    elif qual == "torch.nn.Parameter":
                        reported.update(id(m) for m in astutil.walk(e))
                        self.report(e, f"isinstance(..., {_code(e)}): the port's tensors are JAX arrays",
                                    Fix((Edit(e, cst.parse_expression(jax_array)),), safety=Safety.UNSAFE,
                                        imports=("jax",)))
            if isinstance(n, cst.Attribute):
                reported.add(id(n.attr))  # `jax.nn`'s `nn` is no free name (a file's own `nn` may be torch's)
            if isinstance(n, (cst.Attribute, cst.Name)):
                qual = ctx.qualname(n)
                if qual and qual.startswith(_HOST):
                    reported.update(id(m) for m in astutil.walk(n))
                    continue
                if qual and program.under_ported_library(qual):
                    reported.update(id(m) for m in astutil.walk(n))  # library model code ported with the program
                    continue
                if qual and qual.split(".")[0] in ("torch", "torchvision"):
                    # the longest dotted chain only (torch.nn.functional.relu, not torch.nn)
                    reported.update(id(m) for m in astutil.walk(n))
                    self.report(n, f"{qual} is torch code left in the JAX port (no JAX translation here): "
                                   "port this line by hand")
                    continue
            if isinstance(n, cst.Attribute):
                attr = n.attr.value
                recv = n.value
                if attr in _TORCH_ONLY and (attr in _ATTRIBUTES or id(n) in called):  # `args.cuda` is a flag
                    reported.add(id(n))
                    self.report(n, f".{attr} left in the JAX port: {_TORCH_ONLY[attr]}")
                    continue
                if attr in _TENSOR_ONLY and (_is_jax_value(recv, ctx, jax_names, jitted, models)
                                             or attr == "data" and id(n) in operands):
                    reported.add(id(n))
                    if attr == "data":
                        self.report(n, f"{_code(recv)}.data: a JAX array has no .data (it is its own data)",
                                    Fix((Edit(n, recv),)))
                    else:
                        self.report(n, f"{_code(recv)}.{attr}: {_code(recv)} is a JAX array here, which has no .{attr} "
                                       "(np.asarray(x) for numpy, x.shape for sizes, x.astype for dtypes)")


# ----------------------------------------------------------------------------------------
def _scopes(root: cst.CSTNode, ctx):
    """The module and every function / class (each scope's own statements are read alone), not
    the input pipeline's classes (Dataset, Sampler subclasses) and what they hold."""
    stack = [root]
    while stack:
        cur = stack.pop()
        if _is_pipeline_class(cur, ctx) or id(cur) in ctx.emitted:  # (porter's own helpers: JAX code)
            continue
        yield cur
        stack.extend(n for n in astutil.walk(cur) if n is not cur and isinstance(n, (cst.FunctionDef, cst.ClassDef)))


def _statements(scope: cst.CSTNode):
    """The simple statements and compound-statement headers of a scope, not of nested scopes."""
    body = scope.body
    stack = list(body.body) if isinstance(body, cst.IndentedBlock) else list(getattr(scope, "body", []))
    if isinstance(scope, cst.Module):
        stack = list(scope.body)
    stack.reverse()
    while stack:
        st = stack.pop()
        if isinstance(st, (cst.FunctionDef, cst.ClassDef)):
            continue
        yield st
        if isinstance(st, cst.BaseCompoundStatement):
            inner: list = []
            for part in ("body", "orelse", "handlers", "finalbody"):
                p = getattr(st, part, None)
                if p is None:
                    continue
                for x in (p if isinstance(p, (list, tuple)) else [p]):
                    if isinstance(x, cst.IndentedBlock):
                        inner.extend(x.body)
                    elif isinstance(x, (cst.Else, cst.Finally, cst.ExceptHandler)):
                        inner.extend(x.body.body if isinstance(x.body, cst.IndentedBlock) else [])
                    elif isinstance(x, cst.If):
                        inner.append(x)
            stack.extend(reversed(inner))


def _own_nodes(stmt: cst.CSTNode):
    """The nodes of a statement itself: a simple statement whole, a compound statement's header
    (its test, iterable, with items), not its body."""
    if isinstance(stmt, cst.BaseCompoundStatement):
        heads = []
        for part in ("test", "iter", "target", "items", "decorators"):
            p = getattr(stmt, part, None)
            if p is None:
                continue
            heads.extend(p if isinstance(p, (list, tuple)) else [p])
        for h in heads:
            yield from astutil.walk(h, into_functions=True)
        return
    yield from astutil.walk(stmt, into_functions=True)


def _type_hints(stmt: cst.CSTNode) -> set[int]:
    """The nodes of a statement that are type hints, never computed on: annotations
    (`y: Optional[Tensor] = ...`), the value given to a class's `__annotations__`
    (`Out.__annotations__ = {"logits": Tensor}`, a namedtuple's field types) and a type
    variable's bound (`TypeVar("M", bound=nn.Module)`)."""
    hints: set[int] = set()
    for n in _own_nodes(stmt):
        if isinstance(n, cst.Annotation):
            hints.update(id(m) for m in astutil.walk(n.annotation))
        elif isinstance(n, cst.Assign) and any(
                isinstance(t.target, cst.Attribute) and t.target.attr.value == "__annotations__" for t in n.targets):
            hints.update(id(m) for m in astutil.walk(n.value))
        elif isinstance(n, cst.Call) and (
                (isinstance(n.func, cst.Name) and n.func.value == "TypeVar")
                or (isinstance(n.func, cst.Attribute) and n.func.attr.value == "TypeVar")):
            hints.update(id(m) for a in n.args for m in astutil.walk(a.value))  # `TypeVar("M", bound=nn.Module)`
    return hints


def _marked(stmt: cst.CSTNode) -> bool:
    tw = getattr(stmt, "trailing_whitespace", None)
    if tw is not None and tw.comment is not None and "porter: manual" in tw.comment.value:
        return True
    return _nnx.has_manual_marker(stmt) if isinstance(stmt, cst.SimpleStatementLine) else False


def _is_pipeline_class(scope: cst.CSTNode, ctx) -> bool:
    if not isinstance(scope, cst.ClassDef):
        return False
    return any((ctx.qualname(b.value) or "").startswith(("torch.utils.data", "torchvision.datasets")) for b in scope.bases)


def _is_jax_call(call: cst.CSTNode, ctx, jax_names: set, jitted: set, models: set) -> bool:
    if not isinstance(call, cst.Call):
        return False
    f = call.func
    qual = ctx.qualname(f) or ""
    if qual.startswith(("jax.", "flax.")) or qual in ("jax",):
        return True
    if isinstance(f, cst.Name) and (f.value in jitted or f.value in jax_names):
        return True
    return False


# jax.numpy's constructors from other objects: the argument may be anything with a `.data`
# (a dataset's array, `jnp.asarray(train_set.data)`)
_CONVERSIONS = frozenset({"jax.numpy.asarray", "jax.numpy.array", "jax.numpy.frombuffer", "jax.numpy.from_dlpack"})


def _array_operands(nodes: list, ctx) -> set[int]:
    """The ``x.data`` arguments of jax.numpy operations (``jnp.equal(pred, y.data)``, as JX102
    ports ``pred.eq(y.data)``): operands of array arithmetic, which the original's ``.data``
    made tensors. In the port ``x`` may be a numpy array of the batch as well as a JAX array,
    and numpy's ``.data`` is its buffer (a memoryview, which jnp rejects)."""
    found: set[int] = set()
    for n in nodes:
        if isinstance(n, cst.Call):
            q = ctx.qualname(n.func) or ""
            if q.startswith("jax.numpy.") and q not in _CONVERSIONS:
                found.update(id(a.value) for a in n.args
                             if isinstance(a.value, cst.Attribute) and a.value.attr.value == "data")
    return found


def _is_jax_value(expr: cst.CSTNode, ctx, jax_names: set, jitted: set, models: set) -> bool:
    if isinstance(expr, cst.Name):
        return expr.value in jax_names and expr.value not in models
    if isinstance(expr, cst.Subscript):
        return _is_jax_value(expr.value, ctx, jax_names, jitted, models)
    return _is_jax_call(expr, ctx, jax_names, jitted, models)


def _jax_values(scope: cst.CSTNode, ctx, jitted: set, models: set) -> set:
    """Names the scope binds to JAX values: results of jitted functions, jax / jnp calls, calls
    of NNX models of the file (names bound to ``ModelClass(...)``), and names bound from those.
    A name also bound to anything else in the scope is left out."""
    model_names: set = set()
    jax_names: set = set()
    other: set = set()
    assigns = []
    for st in _statements(scope):
        for n in _own_nodes(st):
            if isinstance(n, cst.Assign):
                assigns.append(n)
    for a in assigns:
        if isinstance(a.value, cst.Call) and isinstance(a.value.func, cst.Name) and a.value.func.value in models:
            for t in a.targets:
                if isinstance(t.target, cst.Name):
                    model_names.add(t.target.value)
    for _ in range(2):  # names bound from names bound earlier
        for a in assigns:
            v = a.value
            is_jax = _is_jax_call(v, ctx, jax_names | model_names, jitted, models) or \
                (isinstance(v, cst.Name) and v.value in jax_names)
            for t in a.targets:
                names = [t.target] if isinstance(t.target, cst.Name) else \
                    [e.value for e in t.target.elements if isinstance(e.value, cst.Name)] if isinstance(t.target, (cst.Tuple, cst.List)) else []
                for nm in names:
                    (jax_names if is_jax else other).add(nm.value)
    return (jax_names - other) - model_names


# the arrays of NNX layers under torch's names (None: the layer has no such array)
_NNX_NAMES = {
    "Linear": {"weight": "kernel"}, "Conv": {"weight": "kernel"}, "ConvTranspose": {"weight": "kernel"},
    "Embed": {"weight": "embedding", "bias": None}, "LayerNorm": {"weight": "scale"}, "BatchNorm": {"weight": "scale"},
    "GroupNorm": {"weight": "scale"}, "RMSNorm": {"weight": "scale"},
}

