from porter import gcsdata
from porter.gcsdata import GcsDataRule


class GcsDataRoot(GcsDataRule):
    __doc__ = gcsdata.DOC

    code = "DT001"
    name = "gcs-data-root-torch-xla"
    target = "torch-xla"
    summary = "--data gs://...: the dataset root read from Cloud Storage through fsspec/gcsfs"
    examples = gcsdata.EXAMPLES
    valid = gcsdata.VALID
