"""The checkers of tutorials 09-11: the solution passes, the stub is "not yet", and each common mistake gets its hint."""

from __future__ import annotations

import math

import pytest
import torch

from dpnotebook.exercises import Status, judge
from dpnotebook.grad_sample.samplers.lora import lora_grad_sampler
from dpnotebook.privacy import get_noise_multiplier
from dpnotebook.privacy.clipping import clip_and_sum


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
        return [s / d + z if noise_after else (s + z) / d for s, z in zip(summed, noises)]

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


# -- 10.noise_on_average --------------------------------------------------------------
def on_average(transform=lambda sigma, C, B, N: sigma * C / B, epochs_used=None):
    def fn(batch_size, *, epsilon, epochs, C, N, delta):
        sigma = get_noise_multiplier(
            target_epsilon=epsilon, target_delta=delta, sample_rate=batch_size / N, epochs=epochs_used or epochs
        )
        return transform(sigma, C, batch_size, N)

    return fn


@pytest.mark.parametrize(
    "answer, hint",
    [
        (on_average(lambda s, C, B, N: s * C), "divide by the batch size"),
        (on_average(lambda s, C, B, N: s / B), "sigma * C / B"),
        (on_average(lambda s, C, B, N: s * C / N), "you divided by N"),
        (on_average(epochs_used=1), "calibrated for one epoch"),
        (on_average(lambda s, C, B, N: 3 * s * C / B), "expected sigma*C/B"),
    ],
)
def test_10_mistakes(answer, hint) -> None:  # type: ignore[no-untyped-def]
    verdict = judge("10.noise_on_average", answer)
    assert verdict.status is Status.WRONG and hint in verdict.hint, verdict.hint


def test_10_right() -> None:
    verdict = judge("10.noise_on_average", on_average())
    assert verdict.solved and "B = 256" in verdict.hint
    assert judge("10.noise_on_average", stub).status is Status.NOT_YET


# -- 11.lora_sampler ------------------------------------------------------------------
def scaled(factor):  # type: ignore[no-untyped-def]
    def fn(layer, activations, backprops, K):
        return {p: g * factor(layer, K) for p, g in lora_grad_sampler(layer, activations, backprops, K).items()}

    return fn


def with_frozen(layer, activations, backprops, K):  # type: ignore[no-untyped-def]
    out = lora_grad_sampler(layer, activations, backprops, K)
    out[layer.weight] = torch.zeros(1)
    return out


def transposed(layer, activations, backprops, K):  # type: ignore[no-untyped-def]
    out = lora_grad_sampler(layer, activations, backprops, K)
    return {p: g.transpose(1, 2) for p, g in out.items()}


def only_a(layer, activations, backprops, K):  # type: ignore[no-untyped-def]
    return {layer.lora_A: lora_grad_sampler(layer, activations, backprops, K)[layer.lora_A]}


def last_position_only(layer, activations, backprops, K):  # type: ignore[no-untyped-def]
    if activations[0].dim() == 2:
        return lora_grad_sampler(layer, activations, backprops, K)
    return lora_grad_sampler(layer, [activations[0][:, -1]], backprops[:, -1], K)


@pytest.mark.parametrize(
    "answer, hint",
    [
        (scaled(lambda layer, K: 1 / layer.scale), "off by the factor alpha / r"),
        (scaled(lambda layer, K: layer.scale), "factor alpha / r = 2.5 twice"),
        (scaled(lambda layer, K: K), "K = 3 times too large"),
        (scaled(lambda layer, K: 1 / K), "divided by K twice"),
        (with_frozen, "are frozen"),
        (transposed, "shape"),
        (only_a, "no entry for layer.lora_B"),
        (last_position_only, "with a position dim) differs from the oracle"),
    ],
)
def test_11_mistakes(answer, hint) -> None:  # type: ignore[no-untyped-def]
    verdict = judge("11.lora_sampler", answer)
    assert verdict.status is Status.WRONG and hint in verdict.hint, verdict.hint


def test_11_right() -> None:
    assert judge("11.lora_sampler", lora_grad_sampler).solved
    assert judge("11.lora_sampler", stub).status is Status.NOT_YET
