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
"""

from __future__ import annotations

import torch

BETAS, EPS = (0.9, 0.999), 1e-8  # torch.optim.Adam's defaults, which training always used


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

    def load(self, row: int, optimizer: torch.optim.Adam) -> None:
        """Model `row`'s state from its torch.optim.Adam (nothing to load before its first step)."""
        params = optimizer.param_groups[0]["params"]
        if params[0] not in optimizer.state:
            return
        states = [optimizer.state[p] for p in params]
        self.exp_avg[row] = torch.cat([s["exp_avg"].flatten() for s in states])
        self.exp_avg_sq[row] = torch.cat([s["exp_avg_sq"].flatten() for s in states])
        self.steps[row] = float(states[0]["step"])

    def store(self, row: int, optimizer: torch.optim.Adam) -> None:
        """Write model `row`'s state into its torch.optim.Adam, as torch's own steps would have left it."""
        params = optimizer.param_groups[0]["params"]
        sizes = [p.numel() for p in params]
        step = float(self.steps[row])
        for p, m, v in zip(params, self.exp_avg[row].split(sizes), self.exp_avg_sq[row].split(sizes)):
            optimizer.state[p] = {
                "step": torch.tensor(step, dtype=torch.float32),
                "exp_avg": m.view_as(p).clone(),
                "exp_avg_sq": v.view_as(p).clone(),
            }
