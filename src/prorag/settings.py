"""Kedro project settings."""

import os

from prorag.hooks import GpuPreflightHook, MlflowTrackingHook, ParameterValidationHook, RunVersionHook
from prorag.tracking.timing import NodeTimingHook

os.environ.setdefault("KEDRO_DISABLE_TELEMETRY", "1")

# pluggy calls hooks last-registered first: RunVersionHook pins (or refuses) the inputs before an MLflow run opens.
# GpuPreflightHook before ParameterValidationHook: both run first (tryfirst), the later-registered first.
HOOKS = (GpuPreflightHook(), ParameterValidationHook(), MlflowTrackingHook(), RunVersionHook(), NodeTimingHook())

# Parameters are soft-merged: an env file (conf/gpu, conf/local) overrides the keys it names and keeps the rest
# of conf/base (Kedro's default, "destructive", would replace each top-level namespace wholesale).
CONFIG_LOADER_ARGS = {
    "base_env": "base",
    "default_run_env": "local",
    "merge_strategy": {"parameters": "soft"},
}
