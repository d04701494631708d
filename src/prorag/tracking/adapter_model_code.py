"""The code of every logged adapter model (MLflow "models from code"): copied into the model's artifacts and run
by ``mlflow.pyfunc.load_model``, so that no pickled object is stored or unpickled. See
:mod:`prorag.tracking.adapter_model`."""

import mlflow

from prorag.tracking.adapter_model import PeftAdapterModel

mlflow.models.set_model(PeftAdapterModel())
