"""``opacus.schedulers`` under dpnotebook."""

from dpnotebook.privacy import (
    ExponentialGradClip,
    ExponentialNoise,
    LambdaGradClip,
    LambdaNoise,
    StepGradClip,
    StepNoise,
)

__all__ = ["ExponentialNoise", "LambdaNoise", "StepNoise", "ExponentialGradClip", "LambdaGradClip", "StepGradClip"]
