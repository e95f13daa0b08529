"""How far an optimizer can move two correct runs' weights apart: the allowance a trained checkpoint is compared with.

Two correct runs of one job (neuron and its CPU reference, or N ranks against one process) round differently, so
their gradients differ by rounding. An SGD-like update is linear in the gradient: the weights differ by about
lr x that rounding, which the loss tolerances already cover. A normalising optimizer (Adam and its family,
Adagrad, RMSprop) divides each element's update by that element's own gradient scale: an element whose gradient
is zero up to rounding (a bias before BatchNorm, a constant added to softmax logits, a feature that cancels over
the batch) moves by about +lr in one run and -lr in the other, at every step, whatever the loss tolerance. So a
trained tensor gets an allowance of 2 x sum over its steps of the largest |update| the optimizer can make (in
parameter units), derived below per family with eps = 0 (eps only shrinks an update) and no weight decay (decay
multiplies both runs' weights by the same factor <= 1, which does not widen their difference):

- Adam, AdamW (amsgrad too: its denominator is larger), SparseAdam: the bias-corrected ratio |m_hat| / sqrt(v_hat)
  at step t is at most c_t = (1-b1)/(1-b1^t) x sqrt((1-b2^t)/(1-b2)) x sqrt(sum_{j<t} (b1^2/b2)^j)
  (Cauchy-Schwarz on m_t = (1-b1) sum b1^(t-k) g_k against v_t = (1-b2) sum b2^(t-k) g_k^2; equality is reached
  by some gradient sequence). c_1 = 1; with (0.9, 0.999) c_3 = 1.004, c_10 = 1.04, c_100 = 2.2, c_t -> 7.3.
- Adamax: |m_t| / u_t <= (1-b1) sum_{j<t} (b1/b2)^j, divided by (1-b1^t): 1 at step 1, about 1.01 after.
- NAdam: its two terms, |g_t| / sqrt(v_hat) <= sqrt((1-b2^t)/(1-b2)) and the momentum term as Adam's.
- RAdam: lr x |m_hat| (SGD with momentum, linear in the gradient: no allowance) while rho_t <= 5, then the
  rectification r_t (<= 1) times Adam's c_t.
- Adagrad: |g_t| / sqrt(sum of g^2) <= 1, times its decayed lr.
- RMSprop (not centred): v_t >= (1-alpha) g_t^2, so |g_t| / sqrt(v_t) <= 1/sqrt(1-alpha) (10 with the default
  0.99: RMSprop's first step really moves every element by 10 x lr), and momentum mu multiplies by sum mu^j.
  Centred RMSprop (its denominator can approach 0) and Adadelta have no bound: their tensors are not compared by
  value (said as a warning).
- Lion and other sign optimizers: |update| = lr.
- Rprop: |update| = the element's step size, which starts at lr, grows by at most etaplus a step and is capped
  at step_sizes[1]: min(step_sizes[1], lr x etaplus^(t-1)) at step t.
- Any other optimizer whose class name holds "adam" (FusedAdam, AdamW8bit, PagedAdamW): Adam's c_t with its
  group's betas (their update assumed to be Adam's).
- SGD, ASGD, LBFGS and unknown optimizers: 0, the tight bound (an unknown one is named in a failure's evidence).

This module only computes; the probe (tools/check/probe.py) sums the allowance per parameter at every step of the
job's optimizer, and cpu_loader.py applies it.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

SGD_LIKE = ("SGD", "ASGD", "LBFGS")
UNBOUNDED = ("Adadelta",)


def unwrap(optimizer: Any) -> Any:
    """The optimizer that computes the update, inside wrappers that step it (ZeroRedundancyOptimizer's ``optim``,
    accelerate's ``optimizer``, NamedOptimizer's ``_optimizer``)."""
    import torch

    for _ in range(4):
        inner = next((getattr(optimizer, a, None) for a in ("optim", "optimizer", "_optimizer")
                      if isinstance(getattr(optimizer, a, None), torch.optim.Optimizer)), None)
        if inner is None or inner is optimizer:
            return optimizer
        optimizer = inner
    return optimizer


def family(optimizer: Any) -> tuple[str, str]:
    """(the optimizer's class name, the update family its allowance follows: adam, adamax, nadam, radam, adagrad,
    rmsprop, sign, rprop, unbounded, sgd, or unknown)."""
    name = type(unwrap(optimizer)).__name__
    lower = name.lower()
    for key in ("adamax", "nadam", "radam", "adagrad", "rmsprop"):
        if key in lower:
            return name, key
    if "adam" in lower:
        return name, "adam"
    if name in UNBOUNDED:
        return name, "unbounded"
    if "lion" in lower:
        return name, "sign"
    if name == "Rprop":
        return name, "rprop"
    if name in SGD_LIKE:
        return name, "sgd"
    return name, "unknown"


def _number(value: Any, default: float) -> float:
    try:
        return float(value)
    except (TypeError, ValueError, RuntimeError):
        return default


def step_bound(kind: str, group: dict[str, Any], t: int) -> float:
    """The largest |update| of one element at the parameter's t-th step (t >= 1), in parameter units: the group's
    lr times the family's factor. inf when the family has none; 0 for SGD-like updates."""
    lr = abs(_number(group.get("lr"), 0.0))
    betas = group.get("betas") or (0.9, 0.999)
    b1, b2 = _number(betas[0], 0.9), _number(betas[1], 0.999)
    if kind == "adam":
        return lr * _adam(b1, b2, t)
    if kind == "adamax":
        return lr * _adamax(b1, b2, t)
    if kind == "nadam":
        return lr * _nadam(b1, b2, _number(group.get("momentum_decay"), 4e-3), t)
    if kind == "radam":
        return lr * _radam(b1, b2, t)
    if kind == "adagrad":
        return lr / (1 + (t - 1) * _number(group.get("lr_decay"), 0.0))
    if kind == "rmsprop":
        if group.get("centered"):
            return math.inf
        alpha, mu = _number(group.get("alpha"), 0.99), _number(group.get("momentum"), 0.0)
        return lr * sum(mu ** j for j in range(t)) / math.sqrt(1 - alpha) if alpha < 1 else math.inf
    if kind == "sign":
        return lr
    if kind == "rprop":
        etaplus = _number((group.get("etas") or (0.5, 1.2))[1], 1.2)
        largest = _number((group.get("step_sizes") or (1e-6, 50))[1], 50.0)
        if lr <= 0 or etaplus <= 1:
            return min(lr, largest)
        grown = (t - 1) * math.log(etaplus) + math.log(lr)  # in logs: etaplus^t overflows a float for long runs
        return largest if grown >= math.log(largest) else math.exp(grown)
    if kind == "unbounded":
        return math.inf
    return 0.0


@lru_cache(maxsize=4096)
def _adam(b1: float, b2: float, t: int) -> float:
    if not (0 <= b1 < 1 and 0 < b2 < 1):
        return math.inf
    ratio = b1 * b1 / b2
    return (1 - b1) / (1 - b1 ** t) * math.sqrt((1 - b2 ** t) / (1 - b2) * sum(ratio ** j for j in range(t)))


@lru_cache(maxsize=4096)
def _adamax(b1: float, b2: float, t: int) -> float:
    if not (0 <= b1 < 1 and 0 < b2 <= 1):
        return math.inf
    return (1 - b1) / (1 - b1 ** t) * sum((b1 / b2) ** j for j in range(t))


@lru_cache(maxsize=4096)
def _nadam(b1: float, b2: float, psi: float, t: int) -> float:
    """torch.optim.NAdam: lr x [(1-mu_t)/(1-prod mu) |g_t| + mu_{t+1}/(1-prod' mu) |m_t|] / sqrt(v_hat)."""
    if not (0 <= b1 < 1 and 0 < b2 < 1):
        return math.inf
    mus = [b1 * (1 - 0.5 * 0.96 ** (i * psi)) for i in range(1, t + 2)]
    prod, prod_next = math.prod(mus[:t]), math.prod(mus[:t + 1])
    g_over_v = math.sqrt((1 - b2 ** t) / (1 - b2))
    m_over_v = (1 - b1) * g_over_v * math.sqrt(sum((b1 * b1 / b2) ** j for j in range(t)))
    return (1 - mus[t - 1]) / (1 - prod) * g_over_v + mus[t] / (1 - prod_next) * m_over_v


@lru_cache(maxsize=4096)
def _radam(b1: float, b2: float, t: int) -> float:
    if not (0 <= b1 < 1 and 0 < b2 < 1):
        return math.inf
    rho_inf = 2 / (1 - b2) - 1
    rho_t = rho_inf - 2 * t * b2 ** t / (1 - b2 ** t)
    if rho_t <= 5:
        return 0.0  # lr x m_hat: linear in the gradient, as SGD with momentum
    rect = math.sqrt((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t))
    return rect * _adam(b1, b2, t)


def describe(name: str, kind: str, steps: int, lrs: list[float], allowance: float) -> str:
    """The allowance in words: "AdamW: 3 steps at lr 0.01: allowance 0.06"."""
    if kind in ("sgd", "unknown"):
        what = "an SGD-like update (linear in the gradient)" if kind == "sgd" else "an optimizer the checker does " \
            "not model"
        return f"{name}: {what}: no allowance beyond the loss tolerances"
    if math.isinf(allowance):
        return f"{name}: its update has no bound the checker can derive: values not compared"
    lo, hi = (min(lrs), max(lrs)) if lrs else (0.0, 0.0)
    at = f"at lr {hi:.3g}" if math.isclose(lo, hi) else f"at lr {lo:.3g} to {hi:.3g}"
    return f"{name}: {steps} step{'s' if steps != 1 else ''} {at}: allowance {allowance:.3g}"
