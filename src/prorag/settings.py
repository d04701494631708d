"""Kedro project settings."""

import os
import warnings

from prorag.config_loader import CONFIG_LOADER_ARGS, ProjectConfigLoader
from prorag.hooks.mlflow_tracking import MlflowTrackingHook
from prorag.hooks.preflight import GpuPreflightHook
from prorag.hooks.result_screen import ResultScreenHook
from prorag.hooks.run_versions import RunVersionHook
from prorag.hooks.timing import NodeTimingHook
from prorag.hooks.validation import ParameterValidationHook
from prorag.redaction import install_log_redaction

os.environ.setdefault("KEDRO_DISABLE_TELEMETRY", "1")
# Kedro has configured logging (conf/logging.yml) when it imports this module: every handler (the terminal,
# info.log) now passes records through the one redaction of secrets (issue 32).
install_log_redaction()
# Kedro 1.7's config loader calls OmegaConf's deprecated register_new_resolver on every command: 28 lines of
# warnings before any output of ours, about code neither prorag nor its user can change.
warnings.filterwarnings("ignore", message=r"register_new_resolver\(\) is deprecated", category=UserWarning)

# pluggy calls hooks last-registered first: RunVersionHook pins (or refuses) the inputs before an MLflow run opens;
# GpuPreflightHook before ParameterValidationHook: both run first (tryfirst), the later-registered first;
# ResultScreenHook prints the run's result after every other hook has ended.
_TRACKING = MlflowTrackingHook()
HOOKS = (ResultScreenHook(tracking=_TRACKING), GpuPreflightHook(), ParameterValidationHook(), _TRACKING,
         RunVersionHook(), NodeTimingHook())

# what Kedro reads here; the config loader's arguments are declared beside the loader (config_loader.py)
__all__ = ["CONFIG_LOADER_ARGS", "CONFIG_LOADER_CLASS", "HOOKS"]

# `parameters` come back with the `methods` map resolved (complete entries, stage blocks with their retrievers).
CONFIG_LOADER_CLASS = ProjectConfigLoader
