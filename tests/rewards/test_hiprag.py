

def test_lambda_p_is_bounded_by_one():
    """Issue 32: λp above 1 would make the process bonus outweigh the answer (eq. 1); it is refused."""
    import pytest
    from pydantic import ValidationError

    from prorag.rewards.hiprag import HiPRAGSettings, hierarchical_reward

    with pytest.raises(ValidationError, match="lambda_p"):
        HiPRAGSettings(lambda_p=5.0)
    with pytest.raises(ValueError, match=r"lambda_p must be in \[0, 1\]"):
        hierarchical_reward(1.0, 1.0, 2, 2, lambda_p=5.0)
