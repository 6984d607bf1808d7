"""``porter zoo``: batch conversion of whole model zoos, verified model by model (docs/zoo.md).

``discover`` (which models, which inputs; run in the zoo framework's interpreter), ``model``
(one model's verification and status), ``cache`` (results per model), ``executors`` (local
processes, Ray), ``report`` (JSON, text, the HTML dashboard), ``run`` (the whole command).
Standard library only at import: the MXNet venv imports ``porter.zoo.discover``."""
