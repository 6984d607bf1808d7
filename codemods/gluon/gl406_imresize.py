from __future__ import annotations

import libcst as cst

from porter import astutil
from porter.rules import Example, Fix, Rule, Safety, Severity

from . import _model

_IMRESIZE = ("mxnet.image.imresize", "mxnet.img.imresize", "mxnet.image.image.imresize")
# OpenCV's interpolation codes (cv::InterpolationFlags), which MXNet passes on -> torch's mode
_MODES = {0: "nearest", 1: "bilinear", 2: "bicubic"}
_LEFT = {3: "3 (area): OpenCV's INTER_AREA differs from torch's area mode (adaptive average pooling) unless the "
            "sizes divide, and it enlarges like bilinear",
         4: "4 (Lanczos over 8x8 pixels) has no torch counterpart",
         9: "9 (cubic to enlarge, area to shrink, bilinear otherwise) depends on the sizes",
         10: "10 (a random method) has no torch counterpart"}
_PARAMS = ("src", "w", "h", "interp", "out")


class ImageResize(Rule):
    """
    ## What it does
    Rewrites MXNet's image resize, `mx.image.imresize(src, w, h, interp=1)` (also
    `mx.img.imresize`, `from mxnet.image import imresize`), of an HWC image (uint8 or
    float), to `gluon_imresize(src, w, h, mode)`, an emitted function: torch's
    `interpolate` of the image as NCHW float, with the size `(h, w)` (MXNet's order is
    width, height), in the mode of OpenCV's interpolation code, then back to HWC and to the
    image's dtype (an integer image rounded and saturated, as OpenCV does):

    | `interp` | torch |
    | --- | --- |
    | 0 (nearest) | `mode="nearest"` (the floor of dst * in / out, as OpenCV's INTER_NEAREST) |
    | 1 (bilinear, the default) | `mode="bilinear", align_corners=False` |
    | 2 (bicubic) | `mode="bicubic", align_corners=False` (a = -0.75 in both) |

    The JAX port gets the same function in JAX (rule JX015). Reported for a person: `interp`
    3 (area), 4 (Lanczos), 9, 10 or one that is not a literal (gluoncv's `_get_interp_method`
    picks one from the sizes), `out=`.

    ## Why
    `mx.image.imresize` calls OpenCV's resize on an NDArray; the port's images are tensors.
    OpenCV's bilinear and bicubic resize do not antialias when they shrink and use half-pixel
    centers: torch's `interpolate` with `align_corners=False` and no antialias.

    ## Fix safety
    Measured against mxnet 1.9.1 (its OpenCV resize), enlarging and shrinking, integer and
    fractional factors: nearest is exact (uint8 and float32): safe. Bilinear and bicubic
    agree within float32 rounding on float32 images, but OpenCV computes uint8 images in
    fixed point, and some pixels differ by 1: unsafe.
    """

    code = "GL406"
    name = "gluon-imresize"
    target = "torch"
    summary = "mx.image.imresize(src, w, h, interp) -> gluon_imresize (torch interpolate, OpenCV's modes)"
    severity = Severity.ERROR
    needs_text = ("imresize",)
    needs_document = ("mxnet",)  # Gluon documents only (see Rule.needs_document)
    examples = [
        Example(
            """
            import mxnet as mx

            def thumbnail(img):
                return mx.image.imresize(img, 32, 24, interp=0)
            """,
            """
            import torch


            def gluon_imresize(src, w, h, mode):
                \"\"\"MXNet's mx.image.imresize (OpenCV's resize) of an HWC image to width w and height h:
                torch's interpolate without antialiasing, half-pixel centers (align_corners=False) or
                OpenCV's nearest neighbour (the floor of dst * in / out); an integer image is rounded and
                saturated back to its dtype.\"\"\"
                x = src.permute(2, 0, 1).unsqueeze(0)
                x = x if x.is_floating_point() else x.float()
                kwargs = {} if mode == "nearest" else {"align_corners": False}
                y = torch.nn.functional.interpolate(x, size=(h, w), mode=mode, **kwargs)[0].permute(1, 2, 0)
                if not src.is_floating_point():
                    info = torch.iinfo(src.dtype)
                    y = y.round().clamp(info.min, info.max)
                return y.to(src.dtype)


            def thumbnail(img):
                return gluon_imresize(img, 32, 24, "nearest")
            """,
            title="nearest neighbour: exact",
        ),
        Example(
            """
            from mxnet import image
            from mxnet.image import imresize

            small = image.imresize(img, w=64, h=48)
            large = imresize(img, 640, 480, 2)
            """,
            """
            import torch


            def gluon_imresize(src, w, h, mode):
                \"\"\"MXNet's mx.image.imresize (OpenCV's resize) of an HWC image to width w and height h:
                torch's interpolate without antialiasing, half-pixel centers (align_corners=False) or
                OpenCV's nearest neighbour (the floor of dst * in / out); an integer image is rounded and
                saturated back to its dtype.\"\"\"
                x = src.permute(2, 0, 1).unsqueeze(0)
                x = x if x.is_floating_point() else x.float()
                kwargs = {} if mode == "nearest" else {"align_corners": False}
                y = torch.nn.functional.interpolate(x, size=(h, w), mode=mode, **kwargs)[0].permute(1, 2, 0)
                if not src.is_floating_point():
                    info = torch.iinfo(src.dtype)
                    y = y.round().clamp(info.min, info.max)
                return y.to(src.dtype)


            small = gluon_imresize(img, 64, 48, "bilinear")
            large = gluon_imresize(img, 640, 480, "bicubic")
            """,
            unsafe=True,
            title="bilinear (the default) and bicubic: uint8 images may differ by 1 from OpenCV's fixed point",
        ),
        Example(
            """
            import mxnet as mx

            a = mx.img.imresize(img, 16, 16, interp=3)
            b = mx.image.imresize(img, w, h, interp=method)
            """,
            """
            import mxnet as mx

            a = mx.img.imresize(img, 16, 16, interp=3)  # porter: manual
            b = mx.image.imresize(img, w, h, interp=method)  # porter: manual
            """,
            title="area and an interpolation known only at run time are left for a person",
        ),
    ]
    valid = ["import cv2\nsmall = cv2.resize(img, (32, 24))\n", "import mxnet as mx\nimg = mx.image.imdecode(buf)\n"]

    def visit_Call(self, node: cst.Call) -> None:
        if self.ctx.qualname(node.func) not in _IMRESIZE:
            return
        b = _model.bind(node, _PARAMS)
        name = _model.code(node.func)
        if b.unknown or b.get("out") is not None or b.get("src") is None or b.get("w") is None or b.get("h") is None:
            astutil.report_manual(self, node, f"{name}: arguments porter does not translate (src, w, h, interp are)")
            return
        interp = b.lit("interp", 1)
        if interp in _LEFT:
            astutil.report_manual(self, node, f"{name}: interp={_LEFT[interp]}")
            return
        if not isinstance(interp, int) or isinstance(interp, bool) or interp not in _MODES:
            astutil.report_manual(self, node, f"{name}: interp={b.text('interp')} is not a literal 0, 1 or 2 "
                                              "(nearest, bilinear, bicubic): pick the torch mode by hand")
            return
        mode = _MODES[interp]
        edit, _ = _model.helpers_edit(self.ctx, ["gluon_imresize"])
        imports = _model.torch_name(self.ctx)[1]  # the helper uses torch only (not torch.nn)
        safety = Safety.SAFE if mode == "nearest" else Safety.UNSAFE

        def rewrite(n: cst.Call) -> cst.BaseExpression:
            nb = _model.bind(n, _PARAMS)
            return astutil.parse_expression(
                f"gluon_imresize({_model.code(nb.get('src'))}, {_model.code(nb.get('w'))}, {_model.code(nb.get('h'))}, \"{mode}\")")

        why = "" if safety is Safety.SAFE else " (uint8 images: OpenCV's fixed point may differ by 1)"
        self.report(node, f"{name} (interp={interp}, {mode}) -> gluon_imresize: torch interpolate{why}",
                    Fix((self.replace(node, rewrite), edit), imports=imports, safety=safety))
