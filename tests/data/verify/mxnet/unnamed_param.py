"""A Gluon block with a parameter that no attribute holds (made with ``self.params.get`` and
kept in a dict): the MXNet side cannot give it a torch-style name and must say so."""
from mxnet import gluon


class Scale(gluon.HybridBlock):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(4, in_units=3)
            self.extra = {"scale": self.params.get("scale", shape=(4,), init="ones")}

    def hybrid_forward(self, F, x, **kwargs):
        return self.dense(x) * self.extra["scale"].data()
