"""Small datasets as tensors, ready for a ``DataLoader``: nothing to download.

>>> from dpnotebook.datasets import load_digits_tensors
>>> train, test = load_digits_tensors()
>>> len(train), len(test)
(1438, 359)
>>> x, y = train[0]
>>> x.shape, x.dtype, y.dtype
(torch.Size([1, 8, 8]), torch.float32, torch.int64)
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils.data import TensorDataset

__all__ = [
    "load_digits_tensors",
    "split_tensors",
    "split_by_classes",
    "make_order_task",
    "random_shift",
    "TEXT_VOCABULARY",
    "TEXT_STYLES",
    "make_template_text",
    "decode_text",
]


def split_tensors(
    *tensors: torch.Tensor, test_fraction: float = 0.2, seed: int = 0
) -> tuple[TensorDataset, TensorDataset]:
    """Shuffle rows with a seeded generator and split them into a train and a test dataset.

    >>> import torch
    >>> train, test = split_tensors(torch.arange(10), test_fraction=0.3)
    >>> len(train), len(test)
    (7, 3)
    """
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction={test_fraction!r} is invalid: it must be in (0, 1), e.g. 0.2.")
    n = tensors[0].shape[0]
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    n_test = round(n * test_fraction)
    test, train = order[:n_test], order[n_test:]
    return TensorDataset(*(t[train] for t in tensors)), TensorDataset(*(t[test] for t in tensors))


def load_digits_tensors(*, test_fraction: float = 0.2, seed: int = 0) -> tuple[TensorDataset, TensorDataset]:
    """scikit-learn's handwritten digits (1797 images 8x8, 10 classes), split as :func:`split_tensors` does.

    The images are ``[1, 8, 8]`` float32 in ``[0, 1]`` (pixel values / 16), the labels int64; the data
    ship with scikit-learn, so it works offline.

    Returns:
        ``(train, test)``, two ``TensorDataset`` of ``(image, label)``.
    """
    try:
        from sklearn.datasets import load_digits
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError("load_digits_tensors needs scikit-learn: pip install 'dpnotebook[lab]'.") from err
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(digits.target, dtype=torch.int64)
    return split_tensors(images, labels, test_fraction=test_fraction, seed=seed)


def split_by_classes(
    dataset: TensorDataset, classes: tuple[int, ...] | list[int]
) -> tuple[TensorDataset, TensorDataset]:
    """Split ``(inputs, labels)`` into the samples of ``classes`` and the rest, each relabelled ``0, 1, ...``
    in order: a "public" part and a "private" part that share no sample and no class.

    >>> import torch
    >>> data = TensorDataset(torch.arange(6.0), torch.tensor([0, 1, 2, 3, 4, 1]))
    >>> inside, rest = split_by_classes(data, [0, 1])
    >>> inside.tensors[1].tolist(), rest.tensors[1].tolist()
    ([0, 1, 1], [0, 1, 2])
    """
    inputs, labels = dataset.tensors
    chosen = torch.tensor(sorted(set(int(c) for c in classes)), dtype=labels.dtype)
    if not len(chosen) or not bool(torch.isin(chosen, labels).all()):
        raise ValueError(
            f"classes={list(classes)!r} is invalid: pass labels that occur in the dataset, e.g. [0, 1, 2, 3, 4]."
        )
    mask = torch.isin(labels, chosen)
    parts = []
    for keep in (mask, ~mask):
        kept = labels[keep]
        parts.append(TensorDataset(inputs[keep], torch.searchsorted(torch.unique(kept), kept)))
    return parts[0], parts[1]


def make_order_task(
    n: int = 2000, *, length: int = 12, vocab: int = 20, test_fraction: float = 0.2, seed: int = 0
) -> tuple[TensorDataset, TensorDataset]:
    """A generated text task that needs word order: does word ``1`` come before word ``2``?

    Random words ``3 .. vocab-1`` (``0`` is left for padding) with words ``1`` and ``2`` once each; the
    label is ``1`` when ``1`` comes first, so a bag of words cannot beat chance. ``length >= 2`` tokens
    per sequence, ``vocab >= 4`` words; split as :func:`split_tensors` does.

    Returns:
        ``(train, test)``: ``TensorDataset`` of ``(tokens [length] int64, label int64)``.

    >>> train, test = make_order_task(10, length=5, vocab=6)
    >>> x, y = train[0]
    >>> x.shape, bool((x == 1).sum() == 1 and (x == 2).sum() == 1)
    (torch.Size([5]), True)
    >>> int(y) == int((x == 1).nonzero() < (x == 2).nonzero())
    True
    """
    if length < 2 or vocab < 4:
        raise ValueError(f"length={length}, vocab={vocab} is invalid: need length >= 2 and vocab >= 4.")
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(3, vocab, (n, length), generator=g)
    positions = torch.rand(n, length, generator=g).argsort(dim=1)[:, :2]  # two distinct positions
    rows = torch.arange(n)
    tokens[rows, positions[:, 0]] = 1
    tokens[rows, positions[:, 1]] = 2
    labels = (positions[:, 0] < positions[:, 1]).long()
    return split_tensors(tokens, labels, test_fraction=test_fraction, seed=seed)


def random_shift(max_shift: int = 1, *, seed: int = 0) -> Callable[[torch.Tensor], torch.Tensor]:
    """An augmentation for images ``[C, H, W]``: shift by up to ``max_shift`` pixels each way, zero-filled,
    drawn from its own seeded generator (for :func:`dpnotebook.privacy.augmult_data_loader`).

    >>> import torch
    >>> shift = random_shift(1, seed=0)
    >>> image = torch.zeros(1, 3, 3); image[0, 1, 1] = 1.0
    >>> moved = shift(image)
    >>> moved.shape, float(moved.sum())
    (torch.Size([1, 3, 3]), 1.0)
    """
    if not isinstance(max_shift, int) or max_shift < 0:
        raise ValueError(f"max_shift={max_shift!r} is invalid: use an int >= 0 (pixels).")
    g = torch.Generator().manual_seed(seed)

    def shift(image: torch.Tensor) -> torch.Tensor:
        dy, dx = (int(v) for v in torch.randint(-max_shift, max_shift + 1, (2,), generator=g))
        h, w = image.shape[-2:]
        out = torch.zeros_like(image)
        out[..., max(dy, 0) : h + min(dy, 0), max(dx, 0) : w + min(dx, 0)] = image[
            ..., max(-dy, 0) : h + min(-dy, 0), max(-dx, 0) : w + min(-dx, 0)
        ]
        return out

    return shift


#: The words of :func:`make_template_text`, one token id each (``"."`` ends a sentence).
TEXT_VOCABULARY: tuple[str, ...] = (
    ".", "the", "a", "my", "to", "in", "at", "with", "and",
    "cat", "dog", "bird", "fox", "ball", "stick", "tree", "park", "river", "garden",
    "sees", "chases", "finds", "runs", "sleeps", "small", "big", "red", "quick",
    # words of the "private" style only: names, a clinic, a diary's verbs
    "anna", "ben", "carla", "doctor", "clinic", "pills", "visited", "took", "called", "today",
)  # fmt: skip

_SLOTS = {
    "animal": ("cat", "dog", "bird", "fox"),
    "thing": ("ball", "stick", "tree"),
    "place": ("park", "river", "garden"),
    "verb": ("sees", "chases", "finds"),
    "adj": ("small", "big", "red", "quick"),
    "name": ("anna", "ben", "carla"),
    "past": ("visited", "called"),
}

#: The sentence templates of each style; ``{slot}`` is filled from a word list.
TEXT_STYLES: dict[str, tuple[str, ...]] = {
    "public": (
        "the {animal} {verb} the {thing} .",
        "a {adj} {animal} runs to the {place} .",
        "the {animal} sleeps in the {place} .",
    ),
    "private": (
        "{name} {past} the doctor today .",
        "{name} took my pills at the clinic .",
        "my {adj} {animal} sleeps with {name} .",
    ),
}


def make_template_text(style: str, n: int, *, length: int = 16, seed: int = 0) -> TensorDataset:
    """Generated text for a language model: ``n`` blocks of ``length`` tokens from a style's sentence templates.

    Sentences drawn uniformly from :data:`TEXT_STYLES` ``[style]``, one after the other, cut into blocks
    of ``length + 1`` tokens, each block one record. ``"private"`` is a shifted distribution of the shared
    :data:`TEXT_VOCABULARY`: other templates, and names, a clinic and verbs that public text never uses.

    Returns:
        ``TensorDataset`` of ``(inputs [length], targets [length])`` int64: a block and the same block
        shifted by one token (the next word to predict at each position).

    >>> data = make_template_text("private", 3, length=6)
    >>> inputs, targets = data[0]
    >>> inputs.shape, torch.equal(inputs[1:], targets[:-1])
    (torch.Size([6]), True)
    >>> decode_text(make_template_text("public", 1, length=8)[0][0])
    'the fox sleeps in the garden . the'
    """
    if style not in TEXT_STYLES:
        raise ValueError(f"style={style!r} is invalid: use one of {sorted(TEXT_STYLES)}.")
    for name, value in (("n", n), ("length", length)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} is invalid: it must be an int >= 1.")
    index = {w: i for i, w in enumerate(TEXT_VOCABULARY)}
    g = torch.Generator().manual_seed(seed)

    def pick(words: tuple[str, ...]) -> str:
        return words[int(torch.randint(len(words), (1,), generator=g))]

    templates = TEXT_STYLES[style]
    needed = n * (length + 1)
    stream: list[int] = []
    while len(stream) < needed:
        words = pick(templates).split()
        stream.extend(index[pick(_SLOTS[w[1:-1]]) if w.startswith("{") else w] for w in words)
    blocks = torch.tensor(stream[:needed]).view(n, length + 1)
    return TensorDataset(blocks[:, :-1].contiguous(), blocks[:, 1:].contiguous())


def decode_text(tokens: torch.Tensor) -> str:
    """The words of a 1-d tensor of token ids of :data:`TEXT_VOCABULARY`, space-separated.

    >>> decode_text(torch.tensor([1, 9, 22, 0]))
    'the cat runs .'
    """
    return " ".join(TEXT_VOCABULARY[int(t)] for t in tokens)
