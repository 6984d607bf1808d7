from __future__ import annotations

import libcst as cst

from porter import astutil
from porter.rules import Example, Fix, Rule, Severity

from . import _script as sc

# mx.metric class -> (template key, emitted class, accepted keywords)
_METRICS = {
    "mxnet.metric.Accuracy": ("accuracy", "GluonAccuracy", ("axis", "name")),
    "mxnet.metric.CustomMetric": ("custom", "GluonCustomMetric", ("feval", "name")),
    "mxnet.metric.Perplexity": ("perplexity", "GluonPerplexity", ("ignore_label", "name")),
    "mxnet.metric.Loss": ("loss", "GluonLossMetric", ("name",)),
    "mxnet.metric.TopKAccuracy": ("top_k", "GluonTopKAccuracy", ("top_k", "name")),
    "mxnet.metric.MAE": ("mae", "GluonMAE", ("name",)),
    "mxnet.metric.MSE": ("mse", "GluonMSE", ("name",)),
    "mxnet.metric.RMSE": ("rmse", "GluonRMSE", ("name",)),
}
_IMPORTS = {"accuracy": (), "custom": (), "perplexity": ("torch", "math"), "loss": (), "top_k": ("torch",),
            "mae": ("torch",), "mse": (), "rmse": ("torch",)}
# metrics whose positional arguments are their accepted keywords, in order
_POSITIONAL_AS_KEYWORDS = ("mxnet.metric.Accuracy", "mxnet.metric.Loss", "mxnet.metric.TopKAccuracy",
                           "mxnet.metric.MAE", "mxnet.metric.MSE", "mxnet.metric.RMSE")


def _translatable(ctx, node: cst.Call, name: str) -> bool:
    _, _, keywords = _METRICS[name]
    for a in node.args:
        if a.star:
            return False
        if a.keyword is not None and a.keyword.value not in keywords:
            return False
    if name == "mxnet.metric.Perplexity":
        ignore = astutil.arg(node, "ignore_label", 0)
        if ignore is None or sc.code(ignore.value) != "None":
            return False
    if name == "mxnet.metric.CustomMetric" and len([a for a in node.args if a.keyword is None]) > 2:
        return False
    if name in _POSITIONAL_AS_KEYWORDS and len([a for a in node.args if a.keyword is None]) > len(_METRICS[name][2]):
        return False
    if name == "mxnet.metric.TopKAccuracy":
        top_k = astutil.arg(node, "top_k", 0)
        if top_k is None or not isinstance(astutil.literal(top_k.value), int) or astutil.literal(top_k.value) < 2:
            return False  # MXNet asserts top_k > 1; a computed k stays for a person
    return True


class GluonMetrics(Rule):
    """
    ## What it does
    Translates `mx.metric` objects into small classes emitted in the port (plain PyTorch,
    from templates/gluon_script_metrics.py.j2) with the same `update(labels, preds)`,
    `get() -> (name, value)` and `reset()`, counting on the device:

    | MXNet | port |
    | --- | --- |
    | `mx.metric.Accuracy()` | `GluonAccuracy()`: correct predictions summed in a device tensor |
    | `mx.metric.Perplexity(ignore_label=None)` | `GluonPerplexity()`: negative log probabilities summed on the device |
    | `mx.metric.Loss()` | `GluonLossMetric()` |
    | `mx.metric.CustomMetric(feval, name=)` | `GluonCustomMetric(feval, name=)`: keeps the batches' tensors and applies `feval` to their numpy copies in `get()` |
    | `mx.metric.TopKAccuracy(k)` | `GluonTopKAccuracy(k)`: labels among the k largest of `pred` (`torch.argsort(..., descending=True)[:, :k]`), counted on the device (name `top_k_accuracy_<k>`) |
    | `mx.metric.MAE()`, `MSE()`, `RMSE()` | `GluonMAE()`, `GluonMSE()`, `GluonRMSE()`: each batch's mean (absolute or squared) error, RMSE's square-rooted, summed on the device and averaged over the batches |

    `update()` never reads a value back to the host, so a training step that updates a
    metric stays free of transfers on XLA; `get()` reads (`float(...)`), where the script
    logs. The values are MXNet's: accuracy of `argmax` over `axis` when the prediction's
    shape differs from the label's, the custom function on numpy arrays (its `(sum, count)`
    form too), perplexity as `exp` of the mean negative log of the label's probability
    (clipped at 1e-10 as MXNet does).

    `mx.gluon.metric.X` is the same as `mx.metric.X`. Reported: other metrics (`F1`, `MCC`,
    `PearsonCorrelation`, ...), `Perplexity` with an `ignore_label`, `TopKAccuracy` whose
    `top_k` is not a literal above 1, and arguments the classes do not take.

    ## Why
    MXNet's metrics call `asnumpy()` in every `update()`: on XLA that is a device-to-host
    transfer in each step, which stalls the step pipeline.

    ## Fix safety
    Safe: the same values, read at `get()`.
    """

    code = "GL402"
    name = "gluon-metrics"
    target = "torch"
    summary = "mx.metric.Accuracy/TopKAccuracy/MAE/MSE/RMSE/Perplexity/Loss/CustomMetric -> emitted classes that accumulate on the device"
    severity = Severity.ERROR
    needs_text = ("metric",)
    needs_document = ("mxnet",)  # Gluon documents only (see Rule.needs_document)
    examples = [
        Example(
            """
            import mxnet as mx

            metric = mx.metric.Accuracy()
            """,
            """
            class GluonAccuracy:
                \"\"\"mx.metric.Accuracy counted on the device: update() adds to device tensors and reads
                nothing back; get() reads them (a host sync: call it where the value is logged).\"\"\"

                def __init__(self, axis=1, name="accuracy"):
                    self.axis = axis
                    self.name = name
                    self.reset()

                def reset(self):
                    self.num_correct = 0
                    self.num_inst = 0

                def update(self, labels, preds):
                    for label, pred in zip(labels, preds):
                        if pred.shape != label.shape:
                            pred = pred.argmax(dim=self.axis)
                        self.num_correct = self.num_correct + (pred.flatten().long() == label.flatten().long()).sum()
                        self.num_inst += label.numel()

                def get(self):
                    if self.num_inst == 0:
                        return self.name, float("nan")
                    return self.name, float(self.num_correct) / self.num_inst


            metric = GluonAccuracy()
            """,
        ),
        Example(
            """
            import mxnet as mx

            metric = mx.metric.F1()
            """,
            None,
            title="a metric porter does not emit: reported",
        ),
    ]
    valid = ["acc = Accuracy()\n"]

    def visit_Module(self, node: cst.Module) -> None:
        needed = []
        for n in astutil.walk(node, into_functions=True):
            if isinstance(n, cst.Call):
                name = sc.call_name(self.ctx, n)
                if name in _METRICS and _translatable(self.ctx, n, name):
                    key, cls, _ = _METRICS[name]
                    if key not in needed and not sc.defined_at_top(self.ctx, cls):
                        needed.append(key)
        if not needed:
            return
        imports = tuple(sorted({m for k in needed for m in _IMPORTS[k]}))
        self.report(node, "the port defines the metric classes it uses (" + ", ".join(needed) + ")",
                    Fix((self.replace(node, sc.insert_before_defs(sc.render("gluon_script_metrics.py.j2", metrics=needed))),),
                        imports=imports), severity=Severity.INFO)

    def visit_Call(self, node: cst.Call) -> None:
        name = sc.call_name(self.ctx, node)
        if name is None or not name.startswith("mxnet.metric."):
            return
        if name not in _METRICS or not _translatable(self.ctx, node, name):
            self.report(node, f"{sc.code(node.func)}: porter emits Accuracy, TopKAccuracy(k), MAE, MSE, RMSE, "
                        "Perplexity(ignore_label=None), Loss and CustomMetric; write this metric by hand, accumulating on the device (no asnumpy in update)")
            return
        key, cls, _ = _METRICS[name]

        def build(u: cst.Call) -> cst.Call:
            args = [a for a in u.args if not (a.keyword is not None and a.keyword.value == "ignore_label")]
            if key == "perplexity":
                args = [a for a in args if a.keyword is not None]
            if args:
                args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
            return u.with_changes(func=cst.Name(cls), args=args)

        self.report(node, f"{sc.code(node.func)} -> {cls} (accumulates on the device)", Fix((self.replace(node, build),)))
