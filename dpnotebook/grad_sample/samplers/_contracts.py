"""The contracts every sampler meets: sample rows, and the norm samplers of ghost mode with their registry.

**Sample rows.** A sampler receives tensors whose dim 0 holds ``B*K`` rows, sample-major;
:func:`group_rows`, :func:`sum_rows` and :func:`flat_rows` fold a sample's ``K`` copies
together with what else is summed over, so that no sampler builds ``B*K`` per-row gradients.

**Norm samplers.** A group maker ``make_group(module, calls, K, scratch)``, registered per
layer type (:func:`register_norm_sampler`), gathers every call of one layer in one forward
pass into a :class:`GhostGroup` (norms do not add up over calls, so the calls are joined
first) that gives each sample's squared gradient norms and the weighted sum
``sum_b w_b g_b``. A layer type with none is left to the hooks engine inside ghost mode.
Your own layer takes part by materialising its registered grad sampler's gradients:

>>> import torch
>>> from torch import nn
>>> class Scale(nn.Module):                       # y = x * w, one weight per feature
...     def __init__(self, d):
...         super().__init__()
...         self.w = nn.Parameter(torch.ones(d))
...     def forward(self, x):
...         return x * self.w
>>> from dpnotebook import register_grad_sampler
>>> @register_grad_sampler(Scale)
... def scale_sampler(layer, activations, backprops, K):
...     per_row = activations[0] * backprops                      # [rows, d]
...     return {layer.w: per_row.view(-1, K, per_row.shape[-1]).mean(1)}
>>> _ = register_norm_sampler(Scale, materialises=True)(materialise)
>>> ghost_handler(Scale(3)).materialises
True
>>> unregister_norm_sampler(Scale); ghost_handler(Scale(3)) is None
True
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, TypeVar, cast

import torch
from torch import Tensor, nn

from dpnotebook.errors import GradSampleError
from dpnotebook.grad_sample._engine.calls import LayerCall
from dpnotebook.grad_sample._engine.layer_hooks import bound_arguments, sampler_grad_samples, to_batch_first
from dpnotebook.grad_sample._registry import check_layer_types, find_grad_sampler, load_optional_samplers

Grads = dict[nn.Parameter, Tensor]


# -- sample rows -----------------------------------------------------------------------------------------------
def group_rows(t: Tensor, K: int) -> Tensor:
    """``[B*K, *rest] -> [B, K*prod(middle), last]`` for a trailing feature dim.

    >>> group_rows(torch.zeros(6, 5, 3), K=2).shape
    torch.Size([3, 10, 3])
    """
    middle = K * math.prod(t.shape[1:-1])  # explicit, so that an empty batch reshapes too
    return t.reshape(t.shape[0] // K, middle, t.shape[-1])


def flat_rows(g: Tensor) -> Tensor:
    """``[B, *shape] -> [B, prod(shape)]``, also for a 0-d parameter and for no samples (where ``flatten(1)`` fails).

    >>> flat_rows(torch.zeros(3)).shape, flat_rows(torch.zeros(0, 2, 2)).shape
    (torch.Size([3, 1]), torch.Size([0, 4]))
    """
    return g.reshape(g.shape[0], math.prod(g.shape[1:]))


def sum_rows(t: Tensor, K: int, keep: int) -> Tensor:
    """``[B*K, *middle, *kept] -> [B, *kept]``: the sum over the K copies and the middle dims, divided by K.

    >>> sum_rows(torch.ones(4, 7, 2, 3), K=2, keep=2)[0, 0].tolist()
    [7.0, 7.0, 7.0]
    """
    split = t.dim() - keep
    summed = t.reshape(t.shape[0] // K, K * math.prod(t.shape[1:split]), *t.shape[split:]).sum(1)
    return summed / K if K > 1 else summed


def affine_reference_grads(
    x_hat: Tensor, backprops: Tensor, K: int, param_dims: Sequence[int]
) -> tuple[Tensor, Tensor]:
    """The reference form of every norm layer's affine part ``y = x_hat * weight + bias``.

    Sample ``b``'s weight gradient is the sum of ``x_hat * backprops`` over the positions the
    parameter is shared across (all dims but ``param_dims``: ``(1,)`` for GroupNorm, ``(-2, -1)``
    for a LayerNorm over two dims), averaged over its ``K`` copies; its bias gradient the same
    sum of ``backprops``. Returns ``(weight_grads, bias_grads)``, each ``[B, *parameter shape]``.

    >>> x_hat, g = torch.tensor([[1.0, -1.0], [3.0, 1.0]]), torch.tensor([[2.0, 2.0], [1.0, 1.0]])  # 1 sample, K=2
    >>> affine_reference_grads(x_hat, g, K=2, param_dims=(-1,))
    (tensor([[ 2.5000, -0.5000]]), tensor([[1.5000, 1.5000]]))
    """
    spanned = {d % x_hat.dim() for d in param_dims}
    positions = [d for d in range(1, x_hat.dim()) if d not in spanned]

    def per_sample(t: Tensor) -> Tensor:  # sum over positions (a sum over no dims would sum all), mean over K
        per_row = t.sum(dim=positions) if positions else t
        return per_row.reshape(per_row.shape[0] // K, K, *per_row.shape[1:]).mean(1)

    return per_sample(x_hat * backprops), per_sample(backprops)


def affine_grads(
    layer: nn.Module, x_hat: Tensor, backprops: Tensor, K: int, channels_dim1: bool, *, overwrite_x_hat: bool = False
) -> Grads:
    """:func:`affine_reference_grads` for the present, trainable ``layer.weight`` and ``layer.bias``: the fast form.

    ``channels_dim1``: the parameters span dim 1 (GroupNorm, InstanceNorm), and positions are
    summed without a channels-last copy. ``overwrite_x_hat``: form ``x_hat * backprops`` in
    ``x_hat``'s memory (the caller's scratch).

    >>> ln, x_hat, g = nn.LayerNorm(2), torch.ones(4, 2), torch.ones(4, 2)
    >>> affine_grads(ln, x_hat, g, K=2, channels_dim1=False)[ln.weight].tolist(), x_hat[0].tolist()
    ([[1.0, 1.0], [1.0, 1.0]], [1.0, 1.0])
    """
    ref = getattr(layer, "weight", None)
    ref = ref if ref is not None else getattr(layer, "bias", None)
    keep = ref.dim() if ref is not None else 0  # (no parameter: nothing is reduced)

    def reduce(t: Tensor) -> Tensor:
        return sum_rows(t.flatten(2).sum(2) if channels_dim1 and t.dim() > 2 else t, K, keep)

    return weight_and_bias(
        layer,
        lambda: reduce(x_hat.mul_(backprops) if overwrite_x_hat else x_hat * backprops),
        lambda: reduce(backprops),
    )


def weight_and_bias(layer: nn.Module, weight: Callable[[], Tensor], bias: Callable[[], Tensor]) -> Grads:
    """``{layer.weight: weight(), layer.bias: bias()}`` for those present and trainable (each formed only then).

    >>> lin = nn.Linear(2, 1, bias=False)
    >>> list(weight_and_bias(lin, lambda: torch.zeros(3, 1, 2), lambda: torch.zeros(3, 1)).values())[0].shape
    torch.Size([3, 1, 2])
    """
    out: Grads = {}
    for p, grads in ((getattr(layer, "weight", None), weight), (getattr(layer, "bias", None), bias)):
        if p is not None and p.requires_grad:
            out[p] = grads()
    return out


#: Scratch budget per chunk on a non-CPU device: a GPU holds this easily, and fewer chunks mean fewer launches.
ACCELERATOR_SCRATCH_BYTES = 256 * 2**20


def scratch_bytes(cpu_budget: int, t: Tensor) -> int:
    """The scratch budget for work on ``t``: the budget measured on a CPU there, the accelerator's elsewhere.

    >>> scratch_bytes(8 * 2**20, torch.ones(1)) == 8 * 2**20
    True
    >>> scratch_bytes(8 * 2**20, torch.ones(1, device="meta")) == ACCELERATOR_SCRATCH_BYTES
    True
    """
    return cpu_budget if t.device.type == "cpu" else max(cpu_budget, ACCELERATOR_SCRATCH_BYTES)


# -- the norm-sampler protocol ---------------------------------------------------------------------------------
class Scratch(Protocol):
    """``scratch(key, shape, like)``: a buffer the caller keeps between steps (contents undefined)."""

    def __call__(self, key: tuple[Any, ...], shape: tuple[int, ...], like: Tensor) -> Tensor: ...


@dataclass
class GhostCall:
    """One recorded call (``call``) and, after backward, its output's gradient (``backprops``, batch-first).

    ``scale`` undoes the loss reduction and averages over K (``rows/K`` for a mean, ``1/K`` for a sum).
    """

    call: LayerCall
    backprops: Tensor | None = None
    scale: float = 1.0

    @property
    def released(self) -> bool:  # its per-sample gradients were formed, its inputs and backprops let go
        return self.call.released

    def release(self) -> None:
        self.call.release()
        self.backprops = None

    def received(self) -> Tensor:
        """:attr:`backprops`, once they arrived: groups are made only of calls that received theirs."""
        assert self.backprops is not None, f"{self.call.path}: no backprops received yet"
        return self.backprops

    def activations(self) -> list[Any]:
        c = self.call
        return [to_batch_first(a, c.batch_dim) for a in bound_arguments(c.module, c.args, c.kwargs)]


class GhostGroup:
    """All calls of one layer in one forward pass (see the module docstring)."""

    how = "materialised"

    def sq_norms(self) -> Grads:
        """Every sample's squared gradient norm, per parameter: ``{p: [B]}``."""
        raise NotImplementedError

    def weighted_sums(self, weights: Grads) -> Grads:
        """``sum_b w_b * (sample b's gradient)`` per parameter, for the clip factors ``weights``."""
        raise NotImplementedError

    def drop(self, keep: Tensor) -> None:
        """Zero every record of the samples where ``keep`` (``[B]`` bools) is False (``0 * nan`` is ``nan``)."""
        raise NotImplementedError


def keep_rows(x: Tensor, keep: Tensor) -> Tensor:
    """``x`` (``[B, ...]``) with the rows where ``keep`` is False set to 0 (even NaN or inf ones).

    >>> keep_rows(torch.tensor([[1.0], [float("nan")]]), torch.tensor([True, False])).flatten().tolist()
    [1.0, 0.0]
    """
    return torch.where(keep.view(-1, *[1] * (x.dim() - 1)), x, x.new_zeros(()))


class MaterialisedGroup(GhostGroup):
    """Per-sample gradients held in full (``{p: [B, *p.shape]}``), each multiplied by ``scale`` when used."""

    def __init__(self, grads: Grads, scale: float = 1.0) -> None:
        self.grads, self.scale = grads, scale

    def sq_norms(self) -> Grads:
        return {p: torch.linalg.vector_norm(flat_rows(g), dim=1).pow(2) * self.scale**2 for p, g in self.grads.items()}

    def weighted_sums(self, weights: Grads) -> Grads:
        scaled: dict[tuple[int, torch.dtype], Tensor] = {}  # one product per weight vector (ids held by weights)
        for p, g in self.grads.items():
            if p in weights and (id(weights[p]), g.dtype) not in scaled:
                scaled[id(weights[p]), g.dtype] = weights[p].to(g.dtype) * self.scale
        return {
            p: (scaled[id(weights[p]), g.dtype] @ flat_rows(g)).view(p.shape)
            for p, g in self.grads.items()
            if p in weights
        }

    def drop(self, keep: Tensor) -> None:
        self.grads = {p: keep_rows(g, keep) for p, g in self.grads.items()}

    def absorb(self, other: MaterialisedGroup) -> None:
        """Add the per-sample gradients of ``other`` (another call of the layer, same samples) into these.

        >>> w = nn.Parameter(torch.zeros(2))
        >>> a, b = MaterialisedGroup({w: torch.ones(3, 2)}, 0.5), MaterialisedGroup({w: torch.ones(3, 2)}, 0.5)
        >>> a.absorb(b); a.grads[w][0].tolist()
        [2.0, 2.0]
        """
        if other.scale != self.scale:
            raise GradSampleError(
                f"calls of one forward pass were scaled differently ({self.scale} and {other.scale})."
            )
        for p, g in other.grads.items():
            self.grads[p] = self.grads[p].add_(g) if p in self.grads else g


def materialise(module: nn.Module, calls: list[GhostCall], K: int, scratch: Scratch | None = None) -> MaterialisedGroup:
    """The group maker that forms the registered grad sampler's per-sample gradients, summed over ``calls``."""
    entry = find_grad_sampler(module)
    assert entry is not None, module  # layers without a grad sampler are left to the hooks engine
    total: Grads = {}
    for c in calls:
        bd, bp = c.call.batch_dim, c.received()
        bp = bp.movedim(0, bd) if bd != 0 and bp.dim() > bd else bp  # back to the layer's layout
        for p, g in sampler_grad_samples(entry, c.call, bp, K, c.scale * K).items():
            total[p] = total[p] + g if p in total else g
    return MaterialisedGroup(total)


GroupMaker = Callable[[nn.Module, list[GhostCall], int, Scratch], GhostGroup]


class GhostHandler(NamedTuple):
    """How ghost mode treats one kind of layer: the arguments of :func:`register_norm_sampler`.

    A call that *settles* (always, if the groups materialise) is made into per-sample gradients as
    its backprops arrive and its inputs let go: memory grows with B, not B*K.
    """

    make_group: GroupMaker
    outside: tuple[str, ...] = ()
    materialises: bool = False
    settles: Callable[[nn.Module, GhostCall, int], bool] | None = None

    def settles_call(self, module: nn.Module, call: GhostCall, K: int) -> bool:
        """Whether ``call`` is made into per-sample gradients as soon as its backprops arrive."""
        return self.materialises or (self.settles is not None and self.settles(module, call, K))

    def settled_group(self, module: nn.Module, call: GhostCall, K: int, scratch: Scratch) -> MaterialisedGroup:
        """The per-sample gradients of one settled call."""
        if self.materialises:
            return cast(MaterialisedGroup, self.make_group(module, [call], K, scratch))
        group = materialise(module, [call], K)
        group.how = "materialised (direct)"
        return group


# -- the registry of norm samplers -----------------------------------------------------------------------------
_NORM_SAMPLERS: dict[type, GhostHandler] = {}

#: The layer types a norm sampler is registered for (their closest common base class).
L = TypeVar("L", bound=nn.Module)
#: A group maker, ``make_group(module, calls, K, scratch)`` (its module typed as one of its layer types).
M = TypeVar("M", bound=Callable[..., GhostGroup])


def register_norm_sampler(
    *layer_types: type[L],
    outside: tuple[str, ...] = (),
    materialises: bool = False,
    settles: Callable[[L, GhostCall, int], bool] | None = None,
) -> Callable[[M], M]:
    """Decorator: ghost mode handles ``layer_types`` with the decorated ``make_group(module, calls, K, scratch)``.

    Args:
        *layer_types: ``nn.Module`` subclasses (a subclass that overrides ``forward`` is not matched).
        outside: names of parameters the layer's owner also uses outside its forward (an RNN's recurrence).
        materialises: the maker's groups are :class:`MaterialisedGroup`, made call by call.
        settles: ``settles(module, call, K)``: whether forming a call's per-sample gradients is cheaper.

    Raises:
        TypeError: a layer type that is not an ``nn.Module`` subclass.
    """
    check_layer_types("register_norm_sampler", layer_types)
    # ghost_handler gives the handler only to modules of layer_types, so it may take them as L
    settle = cast("Callable[[nn.Module, GhostCall, int], bool] | None", settles)

    def decorator(make_group: M) -> M:
        for t in layer_types:
            _NORM_SAMPLERS[t] = GhostHandler(make_group, outside, materialises, settle)
        return make_group

    return decorator


def unregister_norm_sampler(*layer_types: type) -> None:
    """Forget the norm samplers of ``layer_types`` (ghost mode then leaves them to the hooks engine)."""
    for t in layer_types:
        _NORM_SAMPLERS.pop(t, None)


def ghost_handler(module: nn.Module) -> GhostHandler | None:
    """The :class:`GhostHandler` of ``module``'s type, or ``None`` (left to the hooks engine).

    A subclass that overrides ``forward`` is not matched.

    >>> import dpnotebook  # registers the built-in norm samplers
    >>> ghost_handler(nn.Conv2d(1, 2, 3)).materialises, ghost_handler(nn.Linear(2, 2)).materialises
    (True, False)
    >>> ghost_handler(nn.BatchNorm1d(3)) is None
    True
    """
    load_optional_samplers()
    if isinstance(module, nn.Embedding) and module.max_norm is not None:
        return None  # max_norm renormalises the weight in place during the forward
    for cls in type(module).__mro__:
        # registered types are nn.Module subclasses (register_norm_sampler checks)
        if cls in _NORM_SAMPLERS and (
            cls is type(module) or type(module).forward is cast(type[nn.Module], cls).forward
        ):
            return _NORM_SAMPLERS[cls]
    return None


def norm_sampler_types() -> list[type]:
    """The layer types that have a norm sampler."""
    return list(_NORM_SAMPLERS)
