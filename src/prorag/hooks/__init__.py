"""The Kedro hooks of every ``kedro run``, one module per concern; ``settings.HOOKS`` lists them in their order.

- :mod:`~prorag.hooks.validation` — every parameter key and type checked against the pipelines' schemas;
- :mod:`~prorag.hooks.preflight` — a GPU run that cannot work refused before any node;
- :mod:`~prorag.hooks.run_versions` — inputs from completed runs that belong together, a manifest per run;
- :mod:`~prorag.hooks.mlflow_tracking` — one MLflow parent run per ``kedro run``, child runs per stage and method;
- :mod:`~prorag.hooks.result_screen` — the run ends on its result;
- :mod:`~prorag.hooks.timing` — time, memory and tokens per node.

They are the application floor: they may import the library (:mod:`prorag.tracking`'s Kedro-free helpers, the
datasets, the GPU preflight), and nothing in the library imports them.
"""
