"""A1111's third UniPC variant, vary_coeff (Zhao et al. 2023, UniPC with varying coefficients, UniPC_v), as the
predictor and corrector of a diffusers UniPCMultistepScheduler handed over by a1111/unipc_time.py, for one call.

The B(h) variants (bh1, bh2: diffusers' solver_type) solve the order conditions for coefficients scaled by one
B(h). vary_coeff instead takes the Taylor conditions' matrix of the past points, C[i][k] = r_i^k / (k + 1)!
(r_i = h_i / h, the last row r = 1: the new point), inverts it, and weighs row k (from 0) of the inverse by
h phi_{k+2}(h) (h phi_1 = e^h - 1, h phi_{k+1} = h phi_k / h - 1 / k!). The predictor uses C without its last row
and column (the points it has), the corrector all of C with the model's output at the predicted point. Its last term
weighs that output by h phi_{K+1} times the last entry of row K - 2 of the inverse (row 0 at order 1), as the
original UniPC code writes it and A1111 runs it, kept so the image is A1111's. Data prediction (predict_x0) only, as
A1111 runs UniPC.

The diffusers class calls `multistep_uni_p_bh_update` / `multistep_uni_c_bh_update` from its `step`; `updates`
binds these two in their place on the scheduler while a call runs. torch where a call runs.
"""

from __future__ import annotations

import contextlib
import types

VARIANT = "vary_coeff"


def _h_phis(hh, count: int) -> list:
    """h phi_k(h) for k = 1 .. count (at index k - 1): e^h - 1, then h phi_{k+1} = h phi_k / h - 1 / k!."""
    import torch

    out, value, factorial = [], torch.expm1(hh), 1
    for k in range(1, count + 1):
        out.append(value)
        value = value / hh - 1 / factorial
        factorial *= k + 1
    return out


def _step(self, x, target: int, current: int, order: int):
    """What the predictor and the corrector share for a step from the level `current` to `target` (indexes into the
    scheduler's sigmas) at `order`: (x at `target` from the first-order term, alpha at `target`, the Taylor matrix C
    (order x order, float64), h phi_k for k = 1 .. order + 1 (index k - 1), the stacked differences D1 of the past
    model outputs over r_i, or None at order 1)."""
    import torch

    if not self.predict_x0:
        raise ValueError("UniPC vary_coeff runs on the data prediction (predict_x0), as A1111 runs it")
    device = x.device

    def level(index):
        alpha, sigma = self._sigma_to_alpha_sigma_t(self.sigmas[index].to(device))
        return alpha, sigma, torch.log(alpha) - torch.log(sigma)

    alpha_t, sigma_t, lambda_t = level(target)
    _, sigma_s0, lambda_s0 = level(current)
    h = lambda_t - lambda_s0
    m0 = self.model_outputs[-1]
    rks, d1s = [], []
    for i in range(1, order):
        rk = (level(current - i)[2] - lambda_s0) / h
        rks.append(rk)
        d1s.append((self.model_outputs[-(i + 1)] - m0) / rk)
    rks = torch.stack(rks + [torch.ones((), device=device)]).double()
    columns, column = [], torch.ones_like(rks)
    for k in range(1, order + 1):  # column k - 1: r^(k - 1) / k!
        columns.append(column)
        column = column * rks / (k + 1)
    taylor = torch.stack(columns, dim=1)
    hh = -h
    base = sigma_t / sigma_s0 * x - alpha_t * torch.expm1(hh) * m0
    return base, alpha_t, taylor, _h_phis(hh, order + 1), torch.stack(d1s, dim=1) if d1s else None


def _weighed(inverse, d1s, x):
    """Each row of `inverse` (over the past points) applied to the differences: one tensor per row."""
    import torch

    return [torch.einsum("k,bkc...->bc...", row.to(x.dtype), d1s) for row in inverse]


def predictor(self, model_output, *args, sample=None, order=None, **kwargs):
    """UniP_v from the step's level to the next: the points it has, the Taylor matrix less the new point."""
    import torch

    step = self.step_index
    x_t, alpha_t, taylor, h_phis, d1s = _step(self, sample, step + 1, step, order)
    if d1s is not None:
        for k, term in enumerate(_weighed(torch.linalg.inv(taylor[:-1, :-1]), d1s, sample)):
            x_t = x_t - alpha_t * h_phis[k + 1] * term
    return x_t.to(sample.dtype)


def corrector(self, this_model_output, *args, last_sample=None, this_sample=None, order=None, **kwargs):
    """UniC_v of the last step, with the model's output at the point its predictor reached."""
    import torch

    step = self.step_index
    x_t, alpha_t, taylor, h_phis, d1s = _step(self, last_sample, step, step - 1, order)
    inverse = torch.linalg.inv(taylor)
    if d1s is not None:
        for k, term in enumerate(_weighed(inverse[:-1, :-1], d1s, last_sample)):
            x_t = x_t - alpha_t * h_phis[k + 1] * term
    last = inverse[max(order - 2, 0), -1].to(last_sample.dtype)  # the original code's row, see the docstring
    x_t = x_t - alpha_t * h_phis[order] * last * (this_model_output - self.model_outputs[-1])
    return x_t.to(last_sample.dtype)


@contextlib.contextmanager
def updates(scheduler, variant: str):
    """The vary_coeff predictor and corrector on `scheduler` for one call where `variant` is vary_coeff (else
    nothing); after it, the class's own again."""
    if variant != VARIANT:
        yield
        return
    scheduler.multistep_uni_p_bh_update = types.MethodType(predictor, scheduler)
    scheduler.multistep_uni_c_bh_update = types.MethodType(corrector, scheduler)
    try:
        yield
    finally:
        del scheduler.multistep_uni_p_bh_update, scheduler.multistep_uni_c_bh_update
