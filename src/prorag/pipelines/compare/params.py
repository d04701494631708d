"""Parameter schema of the compare pipeline (``compare``; see conf/base/parameters_compare.yml).

The schema is :mod:`prorag.reporting.compare_params`, shared with the sft_synthesis pipeline.
"""

from prorag.reporting.compare_params import CompareArm, CompareParams

__all__ = ["CompareArm", "CompareParams"]
