"""P clustering transformers of one shape as one stacked model (training.fused trains it).

Every weight of the P models lives in one flat (P, N) tensor for the life of
the pack: each projection's weight is a (P, out, in) view of it and its
bias a (P, 1, out) view, so a projection is one batched matmul over all
models' tokens and attention runs once over the P * batch tasks. The
gradients land in one flat (P, N) buffer too, so the optimizer
(training.adam) updates the whole pack in a handful of operations, however
many tensors a model has.
"""

from __future__ import annotations

from functools import partial

import torch

from models.attention import distance_attention
from models.embedding import embed
from models.transformer import ClusteringTransformer, layer_equation


class StackedTransformer:
    """The weights of P ClusteringTransformers (same d, k, embedding, gamma, dropout, qkv_mult), stacked."""

    def __init__(self, models: list[ClusteringTransformer]) -> None:
        first = models[0]
        self.d, self.embedding, self.gamma, self.d_emb = (
            first.d,
            first.embedding,
            first.layer.cax.gamma,
            first.d_emb,
        )
        self.dropout = first.layer.cax.dropout
        self.shapes = [(name, p.shape) for name, p in first.named_parameters()]  # state_dict order
        with torch.no_grad():
            self.flat = torch.stack([torch.nn.utils.parameters_to_vector(m.parameters()) for m in models])
        self.grad = torch.zeros_like(self.flat)
        self.forward_fn = stacked_forward  # training.fused may put it through torch.compile (train.compile)
        self._bind()

    def _bind(self) -> None:
        """The named (P, ...) leaves: views of flat, whose gradients accumulate into views of grad."""
        self.weights: dict[str, torch.Tensor] = {}
        P, start = self.flat.shape[0], 0
        for name, shape in self.shapes:
            size = shape.numel()
            view = (1, shape[0]) if len(shape) == 1 else tuple(shape)  # a bias broadcasts over tokens
            leaf = self.flat[:, start : start + size].view(P, *view).detach().requires_grad_()
            # autograd adds into a .grad that exists, in place: the flat buffer gets every gradient.
            leaf.grad = self.grad[:, start : start + size].view(P, *view)
            self.weights[name] = leaf
            start += size

    def __len__(self) -> int:
        return self.flat.shape[0]

    def keep(self, rows: torch.Tensor) -> None:
        """Drop every model but those at `rows` (a pack whose models leave)."""
        self.flat, self.grad = self.flat[rows], self.grad[rows]
        self._bind()

    def load(self, row: int, model: ClusteringTransformer) -> None:
        with torch.no_grad():
            self.flat[row] = torch.nn.utils.parameters_to_vector(model.parameters())

    def store(self, row: int, model: ClusteringTransformer) -> None:
        """Write model `row`'s weights into `model` (for its checkpoint)."""
        with torch.no_grad():
            torch.nn.utils.vector_to_parameters(self.flat[row].clone(), model.parameters())

    def forward(self, X: torch.Tensor, C: torch.Tensor, training: bool = True) -> torch.Tensor:
        """X (P, B, n, d), C (P, B, k, d) -> each model's new centers (P, B, k, d), model p on X[p], C[p]."""
        # Evaluation runs eagerly: under train.compile its no-grad pass would be a graph of its own (a
        # second compile per pack size, as long as the first) for a sixth of the forward passes, with no
        # backward.
        forward = self.forward_fn if training else stacked_forward
        return forward(
            self.weights, X, C, self.embedding, self.gamma, self.d_emb, self.dropout if training else 0.0
        )


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """x (P, ..., in) through P linear maps weight (P, out, in), bias (P, 1, out): one batched matmul."""
    P, shape = x.shape[0], x.shape[1:-1]
    out = torch.baddbmm(bias, x.reshape(P, -1, x.shape[-1]), weight.transpose(1, 2))
    return out.view(P, *shape, -1)


def _attend(
    weights: dict[str, torch.Tensor],
    gamma: float,
    d_emb: int,
    dropout: float,
    name: str,
    queries: torch.Tensor,
    keys: torch.Tensor,
) -> torch.Tensor:
    """Attention module `name` of every model: queries (P, B, Lq, e), keys (P, B, Lk, e)."""

    def project(x: torch.Tensor, *which: str) -> list[torch.Tensor]:
        """The projections `which` of x as one batched matmul: less time than one each in a large pack."""
        names = [f"layer.{name}.{w}" for w in which]
        weight = torch.cat([weights[f"{n}.weight"] for n in names], 1)
        bias = torch.cat([weights[f"{n}.bias"] for n in names], 2)
        return list(_linear(x, weight, bias).split(weights[f"{names[0]}.bias"].shape[-1], -1))

    if queries is keys:  # self-attention (sax, sac): q, k and v of the same tokens
        q, k, v = project(keys, "q", "k", "v")
    else:
        (q,), (k, v) = project(queries, "q"), project(keys, "k", "v")
    h = distance_attention(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), gamma, d_emb, dropout)
    h = h.view(*q.shape[:2], *h.shape[1:])
    return project(h, "out")[0] if f"layer.{name}.out.weight" in weights else h


def stacked_forward(
    weights: dict[str, torch.Tensor],
    X: torch.Tensor,
    C: torch.Tensor,
    embedding: str,
    gamma: float,
    d_emb: int,
    dropout: float,
) -> torch.Tensor:
    """The layer equation (models.transformer) of P models at once, on their stacked weights."""
    P, B, _, d = X.shape
    Xt, Ct = embed(X.flatten(0, 1), C.flatten(0, 1), embedding)
    Xt, Ct = Xt.view(P, B, *Xt.shape[1:]), Ct.view(P, B, *Ct.shape[1:])
    _, C1 = layer_equation(partial(_attend, weights, gamma, d_emb, dropout), Xt, Ct)
    return C1[..., :d]
