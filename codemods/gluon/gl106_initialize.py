import libcst as cst

from porter import astutil
from porter.rules import Example, Fix, Rule, Severity

from . import _model
from . import _script as sc

INITIALIZERS = {"Xavier": "init_xavier", "Normal": "init_normal", "Uniform": "init_uniform",
                "Constant": "init_constant", "Zero": "init_zero", "One": "init_one"}
_PREFIXES = ("mxnet.init.", "mxnet.initializer.")


def initializer_name(node: cst.CSTNode, ctx) -> str | None:
    q = ctx.qualname(node)
    for p in _PREFIXES:
        if q and q.startswith(p) and "." not in q[len(p):]:
            return q[len(p):]
    return None


class GluonInitialize(Rule):
    """
    ## What it does
    `net.initialize(init, ctx=ctx)` -> `initialize(net, init)` then `net.to(ctx)`, and the
    initializers `mx.init.Xavier(...)`, `Normal(sigma)`, `Uniform(scale)`, `Constant(v)`,
    `Zero()`, `One()` -> `init_xavier(...)`, `init_normal(sigma)`... `initialize` and the
    `init_*` functions are emitted into the port (templates/gluon_layers.py.j2) with Gluon's
    semantics: every weight from the initializer (default `Uniform(0.07)`), biases zero,
    BatchNorm's gamma one and beta zero, a layer's own `weight_initializer=` first; Xavier's
    fans counted as MXNet counts them. A lazy layer (input size known at the first forward)
    is initialized right after torch makes its parameters, before it computes: Gluon's
    deferred initialization.

    A context list (`ctx=[mx.gpu(0), mx.gpu(1)]`, or a name bound to one) puts the model on
    the process's one device (its first; GL002 makes the list one device). Other initializers
    (`MSRAPrelu`, `Orthogonal`, `Mixed`...) are reported for a person.

    ## Why
    torch initializes each layer when it is built, with its own defaults (Kaiming uniform);
    Gluon's initializer is applied to the whole model afterwards, so a port without it trains
    from another starting point.

    ## Fix safety
    Safe: the same distributions (the random numbers differ from MXNet's, as any two
    generators' do).
    """

    code = "GL106"
    name = "gluon-initialize"
    target = "torch"
    summary = "net.initialize(mx.init.Xavier(), ctx=ctx) -> initialize(net, init_xavier()); net.to(ctx)"
    severity = Severity.ERROR
    needs_text = ("initialize", "init.")
    needs_document = ("mxnet",)  # Gluon documents only (see Rule.needs_document)
    examples = [
        Example(
            """
            import mxnet as mx

            def build(net, ctx):
                net.initialize(mx.init.Normal(0.02), ctx=ctx)
                return net
            """,
            """
            import torch
            import torch.nn


            def init_uniform(scale=0.07):
                \"\"\"Gluon's mx.init.Uniform: uniform(-scale, scale) (scale 0.07 is Gluon's default init).\"\"\"
                return lambda weight: torch.nn.init.uniform_(weight, -scale, scale)


            def _gluon_init_parameter(param, name, own, norm, init):
                if name in own:
                    own[name](param)
                elif norm and name == "weight":
                    param.fill_(1.0)  # gamma
                elif name.startswith("bias"):
                    param.zero_()
                else:
                    init(param)


            def _gluon_init_module(module, init):
                if isinstance(module, torch.nn.PReLU):
                    return  # Gluon's alpha has its own initializer (Constant(0.25) by default), as torch's
                own = getattr(module, "gluon_init", {})
                norm = isinstance(module, (torch.nn.modules.batchnorm._NormBase, torch.nn.LayerNorm, torch.nn.GroupNorm))
                with torch.no_grad():
                    for name, param in module.named_parameters(recurse=False):
                        _gluon_init_parameter(param, name, own, norm, init)


            def initialize(module, init=None):
                \"\"\"Gluon's Block.initialize: every weight from `init` (default Uniform(0.07)), biases
                zero, BatchNorm gamma one and beta zero, a layer's own initializer first. A lazy layer
                (input size known at the first forward, as Gluon's deferred initialization) is
                initialized right after its parameters are made, before it computes.\"\"\"
                init = init or init_uniform(0.07)
                for layer in module.modules():
                    if isinstance(layer, torch.nn.modules.lazy.LazyModuleMixin) and layer.has_uninitialized_params():
                        def after_materialize(mod, args, init=init):
                            _gluon_init_module(mod, init)
                            mod._gluon_init_hook.remove()

                        def loaded(mod, keys):  # parameters loaded before the first forward are kept
                            mod._gluon_init_hook.remove()

                        layer._gluon_init_hook = layer.register_forward_pre_hook(after_materialize)
                        layer.register_load_state_dict_post_hook(loaded)
                    else:
                        _gluon_init_module(layer, init)


            def init_normal(sigma=0.01):
                \"\"\"Gluon's mx.init.Normal: normal(0, sigma).\"\"\"
                return lambda weight: torch.nn.init.normal_(weight, 0.0, sigma)


            def build(net, ctx):
                initialize(net, init_normal(0.02))
                net.to(ctx)
                return net
""",
            title="a model initialized with Normal(0.02) and placed",
        ),
    ]
    valid = ["import torch\nmodel.initialize()\n"]

    def visit_Call(self, node: cst.Call) -> None:
        if not _model.is_gluon_file(self.ctx):
            return
        name = initializer_name(node.func, self.ctx)
        if name is not None:
            if name not in INITIALIZERS:
                _model.report_manual(self, node, f"mx.init.{name} has no emitted equivalent")
                return
            fn = INITIALIZERS[name]
            edit, imports = _model.helpers_edit(self.ctx, [fn])
            self.report(node, f"mx.init.{name}: {fn}", Fix((
                self.replace(node, lambda n: n.with_changes(func=cst.Name(fn))), edit), imports=imports))

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        if len(node.body) != 1 or not isinstance(node.body[0], cst.Expr):
            return
        call = node.body[0].value
        if not (isinstance(call, cst.Call) and astutil.method_name(call) == "initialize"):
            return
        if not _model.is_gluon_file(self.ctx):
            return
        if any(a.star for a in call.args) or any(
                a.keyword is not None and a.keyword.value not in ("init", "ctx", "verbose", "force_reinit") for a in call.args):
            return
        ctx_arg = astutil.arg(call, "ctx", 1)
        if ctx_arg is not None and sc.one_device(self.ctx, ctx_arg.value) is None:
            _model.report_manual(self, call, "initialize on this context list: one device per process in torch, "
                                 "net.to(device)")
            return
        edit, imports = _model.helpers_edit(self.ctx, ["initialize"])

        def rewrite(stmt: cst.SimpleStatementLine):
            c = stmt.body[0].value
            owner = _model.code(c.func.value)
            init = astutil.arg(c, "init", 0)
            device = astutil.arg(c, "ctx", 1)
            args = owner + (f", {_model.code(init.value)}" if init is not None else "")
            lines = [stmt.with_changes(body=[cst.Expr(cst.parse_expression(f"initialize({args})"))])]
            if device is not None:
                one = sc.one_device(self.ctx, device.value)  # a context list: its one device (GL002)
                lines.append(cst.SimpleStatementLine([cst.Expr(cst.parse_expression(
                    f"{owner}.to({_model.code(one)})"))]))
            return cst.FlattenSentinel(lines)

        self.report(call, "Gluon's initialize: the emitted initialize() with Gluon's defaults", Fix(
            (self.replace(node, rewrite), edit), imports=imports))
