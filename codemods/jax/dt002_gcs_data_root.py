from porter import gcsdata
from porter.gcsdata import GcsDataRule


class GcsDataRoot(GcsDataRule):
    __doc__ = gcsdata.DOC

    code = "DT002"
    name = "gcs-data-root-jax"
    target = "jax"
    summary = "--data gs://...: the dataset root read from Cloud Storage through fsspec/gcsfs"
    examples = gcsdata.EXAMPLES
    valid = gcsdata.VALID
