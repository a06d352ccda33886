"""Per-sample gradients of any layer that does not mix samples, with ``torch.func``.

When a layer has no registered sampler, we replay its forward pass for one
sample at a time inside ``vmap``: for sample ``i`` we take the gradient of

    sum_k < layer(params, x[i, k]), backprop[i, k] >

with respect to the parameters. That is exactly ``sum_k grad loss(row i*K+k)``,
so dividing by ``K`` gives the augmentation-multiplicity average, and ``vmap``
over the ``B`` samples never builds ``B*K`` per-row gradients.

The replay keeps its own activations while it runs. With ``K`` rows per sample
they would be ``K`` times those of a plain batch of ``B``, so by default ``vmap``
takes the samples in chunks that hold no more rows than ``B`` (see
:func:`replay_chunk_size`).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor, nn
from torch.func import functional_call, grad, vmap
from torch.utils._pytree import tree_flatten, tree_unflatten

from dpnotebook.errors import GradSampleError
from dpnotebook.grad_sample.engine.packed import refuse_packed
from dpnotebook.grad_sample.engine.precision import full_precision

_PAUSED = [0]


@contextlib.contextmanager
def capture_paused() -> Iterator[None]:
    """Forward hooks record nothing inside this block (used while replaying a layer)."""
    _PAUSED[0] += 1
    try:
        yield
    finally:
        _PAUSED[0] -= 1


def capture_is_paused() -> bool:
    return _PAUSED[0] > 0


_REPLAYING: list[LayerCall] = []


@contextlib.contextmanager
def replaying(call: LayerCall) -> Iterator[None]:
    """Inside this block, :func:`replayed_call` is ``call``: hooks can tell a replay from a forward pass."""
    _REPLAYING.append(call)
    try:
        yield
    finally:
        _REPLAYING.pop()


def replayed_call() -> LayerCall | None:
    """The call being replayed by :func:`fallback_grad_samples`, or ``None`` outside a replay."""
    return _REPLAYING[-1] if _REPLAYING else None


@dataclass
class LayerCall:
    """What one call of a layer saw in the forward pass.

    Attributes:
        module: the layer.
        path: its name in the wrapped model, for messages.
        args: positional arguments (tensors detached).
        kwargs: keyword arguments (tensors detached).
        out_index: positions, in the flattened output, of the tensors whose
            gradients the backward hook receives.
        batch_dim: the dimension holding the ``B*K`` rows.
        rows: ``B*K``.
        forward_id: which forward pass of the wrapper this call belongs to.
    """

    module: nn.Module
    path: str
    args: tuple
    kwargs: dict
    out_index: list[int]
    batch_dim: int
    rows: int
    forward_id: int
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def released(self) -> bool:
        """Its per-sample gradients were formed and its inputs let go (see :meth:`release`)."""
        return bool(self.extra.get("released"))

    def release(self) -> None:
        """Let go of the inputs: a hook lives as long as the graph, and holding them would keep
        every layer's input alive to the end of backward, where autograd frees each as it goes."""
        self.args, self.kwargs, self.extra["released"] = (), {}, True


def _split_rows(t: Tensor, dim: int, B: int, K: int) -> Tensor:
    return t.unflatten(dim, (B, K))


def check_replay_chunk(replay_chunk: Any) -> int | str | None:
    """Validate ``replay_chunk``: how many samples a ``torch.func`` replay takes at once.

    >>> check_replay_chunk(0)
    Traceback (most recent call last):
    ...
    ValueError: replay_chunk=0 is invalid; use "auto" (at most B rows at once), None (all samples at once: fastest, but the replay's memory grows with K) or an int >= 1 (that many samples at once).
    """
    if replay_chunk in ("auto", None) or (
        isinstance(replay_chunk, int) and not isinstance(replay_chunk, bool) and replay_chunk >= 1
    ):
        return replay_chunk
    raise ValueError(
        f'replay_chunk={replay_chunk!r} is invalid; use "auto" (at most B rows at once), None (all '
        "samples at once: fastest, but the replay's memory grows with K) or an int >= 1 (that many "
        "samples at once)."
    )


def replay_chunk_size(B: int, K: int, replay_chunk: int | str | None = "auto") -> int | None:
    """How many samples ``vmap`` replays at once (``None``: all of them, ``vmap``'s default).

    ``"auto"`` takes all samples at ``K=1`` and chunks of ``ceil(B/K)`` samples
    otherwise: at most ``B + K - 1`` rows, so the replay's activations stay those
    of a plain batch of ``B`` rather than growing ``K``-fold with the rows. Each
    chunk replays the forward pass once more, which costs time on models of many
    small operations (a recurrent loop); ``replay_chunk=None`` trades the memory
    back for that time.

    >>> replay_chunk_size(32, 1) is None, replay_chunk_size(32, 16), replay_chunk_size(3, 16)
    (True, 2, 1)
    >>> replay_chunk_size(32, 16, None) is None, replay_chunk_size(32, 16, 8)
    (True, 8)
    """
    if replay_chunk == "auto":
        return None if K == 1 else max(1, -(-B // K))
    assert not isinstance(replay_chunk, str), replay_chunk  # check_replay_chunk lets no other string through
    return replay_chunk


def fallback_grad_samples(
    call: LayerCall, grads: list[Tensor | None], K: int, scale: float, replay_chunk: int | str | None = "auto"
) -> dict[nn.Parameter, Tensor]:
    """Per-sample gradients of every trainable parameter of ``call.module`` (submodules included).

    Args:
        call: the recorded forward call.
        grads: gradient of the loss w.r.t. each output tensor in ``call.out_index`` (or None).
        K: augmentation multiplicity.
        scale: factor that undoes the loss reduction (``B*K`` for a mean).
        replay_chunk: samples replayed at once (see :func:`replay_chunk_size`).
    """
    module, bd, rows = call.module, call.batch_dim, call.rows
    B = rows // K
    trainable = {n: p for n, p in module.named_parameters() if p.requires_grad}
    if not trainable:
        return {}
    if B == 0:
        return {p: p.new_zeros((0, *p.shape)) for p in trainable.values()}
    refuse_packed(call.args, call.kwargs, "hooks", module)  # functorch mode refuses it in its forward
    fixed = {n: p.detach() for n, p in module.named_parameters() if not p.requires_grad}
    fixed.update(dict(module.named_buffers()))

    leaves, spec = tree_flatten((call.args, call.kwargs))
    leaves = [full_precision(x) for x in leaves]  # recorded under autocast: replayed in float32
    in_dims = [bd if isinstance(x, Tensor) and x.dim() > bd and x.shape[bd] == rows else None for x in leaves]
    batched = [_split_rows(x, bd, B, K) if d is not None else x for x, d in zip(leaves, in_dims, strict=True)]
    used = [(i, g) for i, g in zip(call.out_index, grads, strict=True) if g is not None]
    for i, g in used:
        if g.dim() <= bd or g.shape[bd] != rows:
            raise GradSampleError(
                f"{call.path} ({type(module).__name__}): output {i} has shape {tuple(g.shape)}, "
                f"which does not hold the batch's {rows} rows in dim {bd}, so torch.func cannot "
                "split it per sample. Register a grad sampler for this layer "
                "(dpnotebook.register_grad_sampler) or use its DP replacement."
            )
    out_pos = [i for i, _ in used]
    out_grads = [_split_rows(full_precision(g), bd, B, K) for _, g in used]

    def sample_loss(params: dict, xs: list, gs: list) -> Tensor:
        args, kwargs = tree_unflatten(xs, spec)
        out, _ = tree_flatten(call_keeping_parameters(module, {**params, **fixed}, args, kwargs))
        return sum((out[i] * g).sum() for i, g in zip(out_pos, gs, strict=True))

    try:
        with capture_paused(), replaying(call), warnings.catch_warnings():
            # vmap runs ops without a batching rule one sample at a time, correctly; its
            # "performance drop" notice is for PyTorch developers, not for our users.
            warnings.filterwarnings("ignore", message="There is a performance drop")
            per_sample = vmap(
                grad(sample_loss),
                in_dims=(None, in_dims, [bd] * len(out_grads)),
                randomness="error",
                chunk_size=replay_chunk_size(B, K, replay_chunk),
            )(trainable, batched, out_grads)
    except Exception as err:  # re-raised with the layer's name and the way out
        why = (
            "it draws random numbers in its forward (dropout?), and a replay would draw "
            "different ones than the real forward did"
            if "random" in str(err)
            else str(err)
        )
        raise GradSampleError(
            f"{call.path} ({type(module).__name__}) has no registered grad sampler and "
            f"torch.func could not compute its per-sample gradients: {why}.\n"
            "Fix: register one with dpnotebook.register_grad_sampler, replace the layer with a "
            "supported one (dpnotebook.validate(model) lists them), or move the dropout out of it "
            "into its own nn.Dropout module."
        ) from err
    return {p: per_sample[n] * (scale / K) for n, p in trainable.items()}


def call_keeping_parameters(module: nn.Module, tensors: dict, args: tuple, kwargs: dict) -> Any:
    """``functional_call(module, tensors, args, kwargs)``, and the module's own parameters and buffers after it.

    PyTorch's ``functional_call`` does not put back the parameters of a
    submodule reachable by two paths (``self.a = Sequential(shared)``,
    ``self.b = Sequential(shared)``): they stay replaced by the tensors of the
    call, so the optimizer would update parameters the model no longer holds.
    Whatever it left behind is restored here.

    >>> import torch
    >>> shared = nn.Linear(2, 2)
    >>> model = nn.Sequential(nn.Sequential(shared), nn.Sequential(shared))
    >>> tensors = {n: p.detach() for n, p in model.named_parameters()}
    >>> _ = call_keeping_parameters(model, tensors, (torch.ones(1, 2),), {})
    >>> shared.weight is model[0][0].weight and isinstance(shared.weight, nn.Parameter)
    True
    """
    held = [(m, m._parameters.copy(), m._buffers.copy()) for m in module.modules()]
    try:
        return functional_call(module, tensors, args, kwargs)
    finally:
        for m, parameters, buffers in held:
            for name, p in parameters.items():
                if m._parameters.get(name) is not p:
                    m._parameters[name] = p
            for name, b in buffers.items():
                if m._buffers.get(name) is not b:
                    m._buffers[name] = b


def loss_scale(loss_reduction: str, rows: int) -> float:
    """Factor that turns backprops of the reduced loss into backprops of each row's own loss."""
    return float(rows) if loss_reduction == "mean" else 1.0


def detach_tree(tree: Any) -> Any:
    """``tree`` with every tensor detached (nested lists, tuples and dicts).

    >>> import torch
    >>> x = torch.ones(2, requires_grad=True)
    >>> out = detach_tree((x, {"mask": x}, 3))
    >>> out[0].requires_grad, out[1]["mask"].requires_grad, out[2]
    (False, False, 3)
    """
    if type(tree) is tuple and all(isinstance(x, Tensor) for x in tree):  # a layer's usual arguments
        return tuple(x.detach() for x in tree)
    if type(tree) is dict and not tree:
        return {}
    leaves, spec = tree_flatten(tree)
    return tree_unflatten([x.detach() if isinstance(x, Tensor) else x for x in leaves], spec)


__all__ = [
    "LayerCall",
    "capture_paused",
    "capture_is_paused",
    "replaying",
    "replayed_call",
    "fallback_grad_samples",
    "check_replay_chunk",
    "replay_chunk_size",
    "loss_scale",
    "detach_tree",
]
