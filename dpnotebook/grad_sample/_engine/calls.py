"""A recorded layer call: where its rows are, and its replay with ``torch.func``.

**Rows.** A forward pass's input carries ``B*K`` rows (:func:`count_rows`). Functorch mode also
needs the output's batch dim (:func:`output_batch_dims`): a recurrent model reading ``[T, B, D]``
often returns ``[B, classes]``; when several dims hold ``B*K``, one more input row tells them apart.
A ``PackedSequence`` is refused where its rows would be split (its rows are time steps).

**Replay.** A layer without a registered sampler is replayed one sample at a time under ``vmap``:
the gradient of ``sum_k <layer(params, x[i, k]), backprop[i, k]>`` is ``sum_k grad loss(row i*K+k)``,
so dividing by ``K`` gives the augmentation-multiplicity average without ``B*K`` per-row gradients.

>>> import torch
>>> count_rows((torch.zeros(13, 7, dtype=torch.long),), {}, batch_first=True)
13
>>> class LastStep(nn.Module):      # [T, B, D] in, [B, D] out
...     def forward(self, x):
...         return x[-1] * 2
>>> x = torch.randn(4, 4, 4)       # [B, D] out with D == B: only a second run can tell
>>> output_batch_dims(LastStep(), (x,), {}, LastStep()(x), [0], rows=4, batch_dim=1)
[0]
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap
from torch.nn.utils.rnn import PackedSequence
from torch.utils._pytree import tree_flatten, tree_unflatten

from dpnotebook.errors import GradSampleError
from dpnotebook.grad_sample._engine.precision import full_precision

_PAUSED = [0]


@contextlib.contextmanager
def capture_paused() -> Iterator[None]:
    """Forward hooks record nothing inside this block (a replay, a probe)."""
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
        args, kwargs: its arguments (tensors detached).
        out_index: positions, in the flattened output, of the tensors whose gradients the hook receives.
        batch_dim: the dimension holding the ``B*K`` rows.
        rows: ``B*K``.
        forward_id: which forward pass of the wrapper this call belongs to.
        released: its per-sample gradients were formed and its inputs let go (:meth:`release`).
    """

    module: nn.Module
    path: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    out_index: list[int]
    batch_dim: int
    rows: int
    forward_id: int
    released: bool = False

    def release(self) -> None:
        """Let go of the inputs (a hook lives as long as the graph: autograd frees each input as it goes)."""
        self.args, self.kwargs, self.released = (), {}, True


def check_replay_chunk(replay_chunk: Any) -> int | str | None:
    """Validate ``replay_chunk``: how many samples a ``torch.func`` replay takes at once.

    >>> check_replay_chunk(0)
    Traceback (most recent call last):
    ...
    ValueError: replay_chunk=0 is invalid; use "auto" (at most B rows at once), None (...) or an int >= 1 (...).
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
    """How many samples ``vmap`` replays at once (``None``: all of them).

    ``"auto"`` takes all samples at ``K=1`` and chunks of ``ceil(B/K)`` samples otherwise: at most
    ``B + K - 1`` rows, so the replay's activations stay those of a plain batch of ``B``.

    >>> replay_chunk_size(32, 1) is None, replay_chunk_size(32, 16), replay_chunk_size(3, 16)
    (True, 2, 1)
    >>> replay_chunk_size(32, 16, None) is None, replay_chunk_size(32, 16, 8)
    (True, 8)
    """
    if replay_chunk == "auto":
        return None if K == 1 else max(1, -(-B // K))
    return None if isinstance(replay_chunk, str) else replay_chunk  # check_replay_chunk lets no other through


def fallback_grad_samples(
    call: LayerCall, grads: list[Tensor | None], K: int, scale: float, replay_chunk: int | str | None = "auto"
) -> dict[nn.Parameter, Tensor]:
    """Per-sample gradients of every trainable parameter of ``call.module`` (submodules included).

    ``grads`` are the gradients of each output tensor in ``call.out_index`` (or None); ``scale``
    undoes the loss reduction (``B*K`` for a mean).
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
    batched = [x.unflatten(bd, (B, K)) if d is not None else x for x, d in zip(leaves, in_dims, strict=True)]
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
    out_grads = [full_precision(g).unflatten(bd, (B, K)) for _, g in used]

    def sample_loss(params: dict[str, Any], xs: list[Any], gs: list[Any]) -> Tensor:
        args, kwargs = tree_unflatten(xs, spec)
        out, _ = tree_flatten(call_keeping_parameters(module, {**params, **fixed}, args, kwargs))
        return sum((out[i] * g).sum() for i, g in zip(out_pos, gs, strict=True))

    try:
        with capture_paused(), replaying(call), warnings.catch_warnings():
            # vmap runs ops without a batching rule one sample at a time, correctly: its notice is not for users
            warnings.filterwarnings("ignore", message="There is a performance drop")
            per_sample = vmap(
                grad(sample_loss),
                in_dims=(None, in_dims, [bd] * len(out_grads)),
                randomness="error",
                chunk_size=replay_chunk_size(B, K, replay_chunk),
            )(trainable, batched, out_grads)
    except Exception as err:  # re-raised with the layer's name and the way out
        why = "it draws random numbers (dropout?), which a replay would draw anew" if "random" in str(err) else err
        raise GradSampleError(
            f"{call.path} ({type(module).__name__}) has no registered grad sampler and torch.func could not "
            f"compute its per-sample gradients: {why}.\nFix: register one (dpnotebook.register_grad_sampler), "
            "replace the layer with a supported one (dpnotebook.validate(model) lists them), or move the "
            "dropout out of it into its own nn.Dropout module."
        ) from err
    return {p: per_sample[n] * (scale / K) for n, p in trainable.items()}


def call_keeping_parameters(
    module: nn.Module, tensors: dict[str, Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``functional_call(module, tensors, args, kwargs)``, and the module's own parameters and buffers after it.

    ``functional_call`` does not put back the parameters of a submodule reachable by two paths:
    the optimizer would update parameters the model no longer holds. They are restored here.

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


def _tensors_in_order(obj: Any) -> Any:
    """Yield the tensors and PackedSequences in ``obj``, nested tuples/lists/dicts flattened in order."""
    if isinstance(obj, (Tensor, PackedSequence)):
        yield obj
    elif isinstance(obj, dict) or (hasattr(obj, "keys") and hasattr(obj, "__getitem__") and not isinstance(obj, str)):
        for key in list(obj.keys()):
            yield from _tensors_in_order(obj[key])
    elif isinstance(obj, (tuple, list)):
        for item in obj:
            yield from _tensors_in_order(item)


def count_rows(args: tuple[Any, ...], kwargs: dict[str, Any], *, batch_first: bool, min_dim: int = 1) -> int | None:
    """The number of rows of the forward's input: the size of its batch dim, or ``None``.

    The first tensor (positional arguments, then keyword arguments, nested containers flattened in
    order) that has the batch dim (0 if ``batch_first`` else 1) and ``min_dim`` dims or more decides
    (``GradSampleModule`` passes 2: a 1-d input may be an ``EmbeddingBag``'s flat indices). A
    ``PackedSequence`` carries one row per sequence.

    >>> import torch
    >>> from torch.nn.utils.rnn import pack_sequence
    >>> count_rows((torch.zeros(5, 4, 3),), {}, batch_first=False)
    4
    >>> count_rows((torch.tensor(True), 3), {"x": {"input_ids": torch.zeros(6, 9)}}, batch_first=True)
    6
    >>> count_rows((pack_sequence([torch.zeros(3, 2), torch.zeros(1, 2)]),), {}, batch_first=False)
    2
    >>> count_rows((torch.zeros(8),), {"flag": 1}, batch_first=False) is None
    True
    >>> count_rows((torch.zeros(8), torch.zeros(2, 3)), {}, batch_first=True, min_dim=2)
    2
    """
    bd = 0 if batch_first else 1
    first = args[0] if args else None
    if isinstance(first, Tensor) and first.dim() > bd and first.dim() >= min_dim:  # the usual call, cheaply
        return int(first.shape[bd])
    for obj in (args, kwargs):
        for t in _tensors_in_order(obj):
            if isinstance(t, PackedSequence):
                if t.sorted_indices is not None:
                    return len(t.sorted_indices)
                return int(t.batch_sizes[0]) if len(t.batch_sizes) else 0
            if t.dim() > bd and t.dim() >= min_dim:
                return int(t.shape[bd])
    return None


def _one_row_more(tree: Any, rows: int, batch_dim: int) -> Any:
    leaves, spec = tree_flatten(tree)
    grown = [
        torch.cat([x, x.narrow(batch_dim, 0, 1)], batch_dim)
        if isinstance(x, Tensor) and x.dim() > batch_dim and x.shape[batch_dim] == rows
        else x
        for x in leaves
    ]
    return tree_unflatten(grown, spec)


def output_batch_dims(
    model: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    output: Any,
    out_index: list[int],
    *,
    rows: int,
    batch_dim: int,
) -> list[int]:
    """For each output tensor named by ``out_index``, the dim that holds the input's ``rows`` rows.

    ``model`` is run once more (no gradients, one extra row per input tensor in ``batch_dim``) only
    when an output tensor has several dims of size ``rows``.

    Raises:
        GradSampleError: an output has no dim of ``rows`` rows, or several that follow the input's rows.
    """
    leaves = [output] if isinstance(output, Tensor) else tree_flatten(output)[0]
    outputs = [leaves[i] for i in out_index]
    candidates = [[d for d, n in enumerate(t.shape) if n == rows] for t in outputs]
    if all(len(c) == 1 for c in candidates):
        return [c[0] for c in candidates]
    for t, c in zip(outputs, candidates, strict=True):
        if not c:
            raise _no_batch_dim(t, rows, batch_dim)
    with torch.no_grad(), capture_paused():
        probe = model(*_one_row_more(args, rows, batch_dim), **_one_row_more(kwargs, rows, batch_dim))
    probes = tree_flatten(probe)[0]
    dims = []
    for i, t, c in zip(out_index, outputs, candidates, strict=True):
        p = probes[i] if i < len(probes) and isinstance(probes[i], Tensor) else t
        grew = [
            d
            for d in c
            if p.dim() == t.dim()
            and p.shape[d] == rows + 1
            and p.shape[:d] + p.shape[d + 1 :] == t.shape[:d] + t.shape[d + 1 :]
        ]
        if len(grew) != 1:
            raise GradSampleError(
                f"functorch mode: the model's output of shape {tuple(t.shape)} has {len(c)} dims of the "
                f"input's {rows} rows (dims {c}), and one more input row did not tell which one holds the "
                f"batch (grew: {grew}). Fix: return the output with its batch in dim "
                f"{batch_dim} (as batch_first says for the input), or use a batch size that no other dim has."
            )
        dims.append(grew[0])
    return dims


def _no_batch_dim(t: Tensor, rows: int, batch_dim: int) -> GradSampleError:
    return GradSampleError(
        f"functorch mode: the model's output of shape {tuple(t.shape)} has no dim of the input's {rows} rows "
        f"(B*K, in input dim {batch_dim}), so its gradient cannot be split per sample. Fix: return one "
        "output row per input row (a loss over the batch belongs outside the model), and check batch_first."
    )


def refuse_packed(args: tuple[Any, ...], kwargs: dict[str, Any], mode: str, model: nn.Module) -> None:
    """Raise if a ``PackedSequence`` is among ``model``'s arguments: ``mode`` cannot split one per sample."""
    if not kwargs and all(isinstance(a, Tensor) for a in args):  # the usual call, checked cheaply
        return
    leaves, _ = tree_flatten((args, kwargs), is_leaf=lambda x: isinstance(x, PackedSequence))
    packed = next((x for x in leaves if isinstance(x, PackedSequence)), None)
    if packed is not None:
        raise GradSampleError(
            f"grad_sample_mode={mode!r}: {type(model).__name__} received a PackedSequence (batch_sizes="
            f"{packed.batch_sizes.tolist()}): its data {tuple(packed.data.shape)} interleaves the sequences "
            f"time step by time step, so its rows are time steps, not samples, and {mode} mode cannot split it "
            "per sample. Fix: use grad_sample_mode='hooks' with dpnotebook.DPLSTM / DPGRU / DPRNN, which handle "
            "PackedSequence (dpnotebook.fix(model) swaps them in), or pass a padded tensor (pad_packed_sequence)."
        )
