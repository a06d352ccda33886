"""The checkers of tutorials 09-11: the solution passes, the stub is "not yet", and each common mistake gets its hint."""

from __future__ import annotations

import math

import pytest
import torch

from dpnotebook.exercises import Status, judge
from dpnotebook.privacy import clip_and_sum, get_noise_multiplier


def stub(*args, **kwargs):  # type: ignore[no-untyped-def]
    raise NotImplementedError("your code here")


# -- 09.per_layer_privatize ------------------------------------------------------------
def privatize(
    *,
    bound=lambda C, L: C / math.sqrt(L),
    divisor=lambda e, B: e,
    std=lambda s, C: s * C,
    noise_after=False,
    flat=False,
    order="library",
):
    def fn(grads, *, C, sigma, expected_batch_size, generator):
        L, B = len(grads), grads[0].shape[0]
        if flat:
            summed = clip_and_sum(grads, max_grad_norm=C, clipping="flat").summed
        else:
            summed = clip_and_sum(grads, max_grad_norm=bound(C, L) * math.sqrt(L), clipping="per_layer").summed
        noises = [torch.normal(0.0, std(sigma, C), s.shape, generator=generator, dtype=s.dtype) for s in summed]
        if order == "reversed":
            noises = [
                torch.normal(0.0, std(sigma, C), s.shape, generator=generator, dtype=s.dtype) for s in reversed(summed)
            ][::-1]
        d = divisor(expected_batch_size, B)
        return [s / d + z if noise_after else (s + z) / d for s, z in zip(summed, noises, strict=True)]

    return fn


@pytest.mark.parametrize(
    "answer, hint",
    [
        (privatize(bound=lambda C, L: C), "not to C / sqrt(L)"),
        (privatize(flat=True), "flat clipping"),
        (privatize(divisor=lambda e, B: B), "divide by expected_batch_size"),
        (privatize(bound=lambda C, L: 1e9), "nothing was clipped"),
        (privatize(divisor=lambda e, B: 1.0), "forgot to divide"),
        (privatize(std=lambda s, C: s), "std is sigma; it must be sigma * C"),
        (privatize(noise_after=True), "added after dividing"),
        (privatize(std=lambda s, C: 0.0), "there is no noise"),
    ],
)
def test_09_mistakes(answer, hint) -> None:  # type: ignore[no-untyped-def]
    verdict = judge("09.per_layer_privatize", answer)
    assert verdict.status is Status.WRONG and hint in verdict.hint, verdict.hint


def test_09_right() -> None:
    assert judge("09.per_layer_privatize", privatize()).solved
    verdict = judge("09.per_layer_privatize", privatize(order="reversed"))
    assert verdict.solved and "another order" in verdict.hint
    assert judge("09.per_layer_privatize", stub).status is Status.NOT_YET


# -- 10.noise_on_average ---------------------------------------------------------------
def at_fixed_steps(transform=lambda sigma, C, B, N: sigma * C / B, as_epochs=False, one_epoch=False):
    def fn(batch_size, *, epsilon, steps, C, N, delta):
        length = {"epochs": 1} if one_epoch else {"epochs": steps} if as_epochs else {"steps": steps}
        sigma = get_noise_multiplier(target_epsilon=epsilon, target_delta=delta, sample_rate=batch_size / N, **length)
        return transform(sigma, C, batch_size, N)

    return fn


def _ratio(fn, **setting):  # type: ignore[no-untyped-def]
    return fn(64, **setting) / fn(256, **setting)


QUESTION = {"epsilon": 1.0, "steps": 180, "C": 1.0, "N": 1438, "delta": 1e-5}


@pytest.mark.parametrize(
    "answer, hint",
    [
        (at_fixed_steps(lambda s, C, B, N: s * C), "divide by the batch size"),
        (at_fixed_steps(lambda s, C, B, N: s / B), "sigma * C / B"),
        (at_fixed_steps(lambda s, C, B, N: s * C / N), "you divided by N"),
        (at_fixed_steps(as_epochs=True), "calibrated for `steps` EPOCHS"),
        (at_fixed_steps(one_epoch=True), "calibrated for one epoch"),
        (at_fixed_steps(lambda s, C, B, N: 1.5 * s * C / B), "expected sigma*C/B"),
    ],
)
def test_10_mistakes(answer, hint) -> None:  # type: ignore[no-untyped-def]
    verdict = judge("10.noise_on_average", answer, advantage=1.0)
    assert verdict.status is Status.WRONG and hint in verdict.hint, verdict.hint


def test_10_right_and_the_ratio() -> None:
    right = at_fixed_steps()
    ratio = _ratio(right, **QUESTION)
    verdict = judge("10.noise_on_average", right, advantage=ratio)
    assert verdict.solved and "B = 256" not in verdict.hint  # the message does not announce a batch size
    assert "other way round" in judge("10.noise_on_average", right, advantage=1 / ratio).hint
    at_epochs = (get_noise_multiplier(target_epsilon=1.0, target_delta=1e-5, sample_rate=64 / 1438, epochs=8) / 64) / (
        get_noise_multiplier(target_epsilon=1.0, target_delta=1e-5, sample_rate=256 / 1438, epochs=8) / 256
    )
    assert "ratio at 8 EPOCHS" in judge("10.noise_on_average", right, advantage=at_epochs).hint
    assert judge("10.noise_on_average", right, advantage=...).status is Status.NOT_YET
    assert judge("10.noise_on_average", stub).status is Status.NOT_YET


# -- 11.not_public ----------------------------------------------------------------------
def _fine_tune():  # type: ignore[no-untyped-def]
    from types import SimpleNamespace

    return SimpleNamespace(noise_multiplier=6.75, steps=110, setting=SimpleNamespace(batch_size=64, delta=1e-5))


def _eleven_answers():  # type: ignore[no-untyped-def]
    from dpnotebook.privacy import compute_epsilon, create_accountant, steps_for_epochs, steps_per_epoch

    steps_pre = steps_for_epochs(20, steps_per_epoch(64 / 716))
    pre = compute_epsilon(noise_multiplier=4.0, sample_rate=64 / 716, steps=steps_pre, delta=1e-5)
    ft = compute_epsilon(noise_multiplier=6.75, sample_rate=64 / 722, steps=110, delta=1e-5)
    acc = create_accountant("pld")
    acc.step(noise_multiplier=4.0, sample_rate=64 / 716, num_steps=steps_pre)
    acc.step(noise_multiplier=6.75, sample_rate=64 / 722, num_steps=110)
    wrong_q = compute_epsilon(noise_multiplier=4.0, sample_rate=64 / 1438, steps=steps_pre, delta=1e-5)
    return pre, ft, acc.get_epsilon(1e-5), wrong_q


def test_11_right_and_mistakes() -> None:
    pre, ft, same, wrong_q = _eleven_answers()
    context = {"fine_tune": _fine_tune(), "n_public": 716, "n_private": 722}
    assert pre > ft and same < pre + ft  # the setting makes every hint below distinguishable
    verdict = judge("11.not_public", (pre, max(pre, ft), same), **context)
    assert verdict.solved, verdict.hint
    cases = {
        "adds the two ε's": (pre, pre + ft, same),
        "protected by pretraining's ε alone": (pre, ft, same),
        "that is the disjoint case": (pre, max(pre, ft), max(pre, ft)),
        "only at twice the δ": (pre, max(pre, ft), pre + ft),
        "not the whole training set": (wrong_q, max(pre, ft), same),
        "one accountant, a step call per phase": (pre, max(pre, ft), same * 1.2),
    }
    for hint, answer in cases.items():
        verdict = judge("11.not_public", answer, **context)
        assert verdict.status is Status.WRONG and hint in verdict.hint, (hint, verdict.hint)
    assert judge("11.not_public", (pre, ..., ...), **context).status is Status.NOT_YET
    assert judge("11.not_public", (..., ..., ...), **context).status is Status.NOT_YET
    assert "tuple" in judge("11.not_public", pre, **context).hint
