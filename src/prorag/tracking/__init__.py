"""Run tracking helpers (MLflow): flattening, metric extraction, secret redaction (from :mod:`prorag.redaction`)."""

from prorag.redaction import is_secret_key, redact, redact_text, redact_value  # the one redaction
from prorag.tracking.mlflow_utils import (
    TrackingParams,
    default_tracking_uri,
    flatten,
    git_sha,
    metric_series,
    portable_paths,
    sanitize_metric_key,
)

__all__ = [
    "TrackingParams",
    "default_tracking_uri",
    "flatten",
    "git_sha",
    "is_secret_key",
    "metric_series",
    "portable_paths",
    "redact",
    "redact_text",
    "redact_value",
    "sanitize_metric_key",
]
