"""Adam over a pack: P models' parameters as one flat (P, N) tensor, each model with its own learning rate.

torch.optim.Adam takes one scalar learning rate per parameter tensor, so it
cannot step a stacked pack whose models follow their own ReduceLROnPlateau
schedules: this is torch's Adam (defaults: betas 0.9, 0.999, eps 1e-8, no
weight decay), written for a (P, 1) learning rate, in a handful of
operations over the whole pack. An update is proposed, then committed only
for the models that keep training (a diverging model keeps its last finite
weights and moments). Its state converts to and from torch.optim.Adam's, so
checkpoints keep torch's format (tests/test_packed.py: equal to torch's
updates to 1e-6).

Between checkpoints a model's own Adam state lives in an AdamState, not a
torch.optim.Adam: constructing any torch Optimizer imports torch._dynamo
(1.5 s of CPU), which every trial process of a sweep would pay for an object
that only holds numbers here.
"""

from __future__ import annotations

import torch

BETAS, EPS = (0.9, 0.999), 1e-8  # torch.optim.Adam's defaults, which training always used


# The rest of torch.optim.Adam's param group: its defaults, which training always used.
TORCH_DEFAULTS = {
    "betas": BETAS,
    "eps": EPS,
    "weight_decay": 0,
    "amsgrad": False,
    "maximize": False,
    "foreach": None,
    "capturable": False,
    "differentiable": False,
    "fused": None,
    "decoupled_weight_decay": False,
}


class AdamState:
    """One model's learning rate and Adam moments, in torch.optim.Adam's state_dict format.

    state maps parameter index (the model's parameters() order) to torch's
    {"step", "exp_avg", "exp_avg_sq"}; empty before the first step. A
    checkpoint's state_dict() loads into torch.optim.Adam, and torch's loads here.
    """

    def __init__(self, shapes: list[torch.Size], lr: float) -> None:
        self.shapes, self.lr = list(shapes), lr
        self.state: dict[int, dict[str, torch.Tensor]] = {}

    def state_dict(self) -> dict:
        group = {**TORCH_DEFAULTS, "lr": self.lr, "params": list(range(len(self.shapes)))}
        return {"state": {i: dict(s) for i, s in self.state.items()}, "param_groups": [group]}

    def load_state_dict(self, state_dict: dict) -> None:
        (group,) = state_dict["param_groups"]
        if len(group["params"]) != len(self.shapes):
            raise ValueError(
                f"the Adam state holds {len(group['params'])} parameters, the model {len(self.shapes)}"
            )
        self.lr = group["lr"]
        self.state = {int(i): dict(s) for i, s in state_dict["state"].items()}


class PackedAdam:
    """Adam moments (P, N), step counts and learning rates (P, 1) of the P models of a pack."""

    def __init__(self, params: torch.Tensor, lrs: list[float]) -> None:
        self.exp_avg = torch.zeros_like(params)
        self.exp_avg_sq = torch.zeros_like(params)
        # float64 like torch's Python scalars: the bias corrections at step 1 lose 1e-5 in float32.
        self.steps = torch.zeros(len(lrs), 1, dtype=torch.float64, device=params.device)
        self.set_lrs(lrs)

    def set_lrs(self, lrs: list[float]) -> None:
        self.lr = torch.tensor(lrs, dtype=torch.float64, device=self.steps.device).unsqueeze(1)

    def propose(self, params: torch.Tensor, grad: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The next parameters and moments of every model, as torch's single-tensor Adam computes them."""
        b1, b2 = BETAS
        exp_avg = self.exp_avg.lerp(grad, 1 - b1)
        exp_avg_sq = (self.exp_avg_sq * b2).addcmul_(grad, grad, value=1 - b2)
        steps = self.steps + 1
        step_size = (self.lr / (1 - b1**steps)).to(params.dtype)
        bias_correction2_sqrt = (1 - b2**steps).sqrt().to(params.dtype)
        denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(EPS)
        return params - step_size * (exp_avg / denom), exp_avg, exp_avg_sq

    def commit(self, params: torch.Tensor, proposal: tuple[torch.Tensor, ...], take: torch.Tensor) -> None:
        """Keep the proposed step of the models where take (P,) is true; the others stay as they were."""
        rows = take.unsqueeze(1)
        for mine, new in zip((params, self.exp_avg, self.exp_avg_sq), proposal):
            mine.copy_(torch.where(rows, new, mine))
        self.steps += rows

    def keep(self, rows: torch.Tensor) -> None:
        """Drop every model but those at `rows`."""
        self.exp_avg, self.exp_avg_sq = self.exp_avg[rows], self.exp_avg_sq[rows]
        self.steps, self.lr = self.steps[rows], self.lr[rows]

    def load(self, row: int, adam: AdamState) -> None:
        """Model `row`'s state from its AdamState (nothing to load before its first step)."""
        if not adam.state:
            return
        states = [adam.state[i] for i in range(len(adam.shapes))]
        self.exp_avg[row] = torch.cat([s["exp_avg"].flatten() for s in states])
        self.exp_avg_sq[row] = torch.cat([s["exp_avg_sq"].flatten() for s in states])
        self.steps[row] = float(states[0]["step"])

    def store(self, row: int, adam: AdamState) -> None:
        """Write model `row`'s state into its AdamState, as torch.optim.Adam's steps would have left it."""
        sizes = [shape.numel() for shape in adam.shapes]
        step = float(self.steps[row])
        moments = zip(adam.shapes, self.exp_avg[row].split(sizes), self.exp_avg_sq[row].split(sizes))
        adam.state = {
            i: {
                "step": torch.tensor(step, dtype=torch.float32),
                "exp_avg": m.view(shape).clone(),
                "exp_avg_sq": v.view(shape).clone(),
            }
            for i, (shape, m, v) in enumerate(moments)
        }
