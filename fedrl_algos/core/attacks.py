"""Byzantine attacks as small strategy objects (the failure models of FedPG-BR, Fan et al. 2021).

An attack acts at up to three points of an agent's round, and only on the rows its boolean mask
``byzantine`` marks (broadcast against the batch ``[*R, n]``); honest rows pass unchanged:

* :meth:`Attack.policy` — the policy the agent *acts* with (random actions);
* :meth:`Attack.trajectories` — the data the agent *learns* from (flipped rewards);
* :meth:`Attack.gradient` — what the agent *reports* (noise, flipped sign, zeros).

Every attack draws its random numbers from the streams it is handed (never from global RNG), and
draws the same amount for every row, so honest agents' numbers never depend on who attacks.
:class:`AttackedEstimator` applies an attack to any :class:`~fedrl_algos.core.GradientEstimator`
(e.g. FedAvg-PG's local steps), :func:`make_attack` builds one by name.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from fedrl_algos.core.directions import GradientEstimator
from fedrl_algos.core.trajectories import Trajectories
from fedrl_envs.rng import RandomStreams, mix64

__all__ = [
    "ATTACKS",
    "Attack",
    "NoAttack",
    "RandomNoise",
    "SignFlip",
    "ZeroGradient",
    "RandomAction",
    "RewardFlip",
    "RandomActionPolicy",
    "AttackedEstimator",
    "make_attack",
    "attack_streams",
]

# Salt of the attack streams derived from an agent's own stream keys.
_ATTACK_SALT = 0x5A17_A77A_C4


def _rows(byzantine: torch.Tensor, like: torch.Tensor, batch_dims: int) -> torch.Tensor:
    """``byzantine`` (broadcastable to the first ``batch_dims`` dims of ``like``) shaped to broadcast over ``like``."""
    mask = byzantine.to(device=like.device, dtype=torch.bool)
    mask = torch.broadcast_to(mask, like.shape[:batch_dims]) if mask.dim() <= batch_dims else mask
    return mask.reshape(*mask.shape, *([1] * (like.dim() - mask.dim())))


def attack_streams(streams: RandomStreams) -> RandomStreams:
    """Streams for attack noise, derived from (and independent of) the agents' streams ``[*B]``."""
    return RandomStreams(mix64(streams.keys ^ _ATTACK_SALT), streams.device)


class Attack:
    """Base class: an honest agent (every hook is the identity)."""

    #: registry name (``random_noise``, ``sign_flip``, ...)
    name: ClassVar[str] = "none"

    def policy(self, policy: Any, byzantine: torch.Tensor) -> Any:
        """The policy the agents act with."""
        return policy

    def trajectories(self, traj: Trajectories, byzantine: torch.Tensor) -> Trajectories:
        """The trajectories ``[*B, m, T, ...]`` the agents compute their gradients from."""
        return traj

    def gradient(self, grad: torch.Tensor, byzantine: torch.Tensor, streams: RandomStreams) -> torch.Tensor:
        """The gradients ``[*B, d]`` the agents report (``streams`` has batch shape ``B``)."""
        return grad

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({fields})"


class NoAttack(Attack):
    """No attack."""


class RandomNoise(Attack):
    """Report the gradient plus uniform noise: ``g + U(−1, 1)·scale·(max g − min g)`` per coordinate.

    The noise is scaled to each gradient's own range, so it stays large whatever the reward scale.

    :param scale: noise amplitude in units of the gradient's range (FedPG-BR uses 3)
    """

    name = "random_noise"

    def __init__(self, scale: float = 3.0) -> None:
        self.scale = float(scale)

    def gradient(self, grad: torch.Tensor, byzantine: torch.Tensor, streams: RandomStreams) -> torch.Tensor:
        u = streams.uniform((grad.shape[-1],), dtype=grad.dtype)
        spread = (grad.amax(-1, keepdim=True) - grad.amin(-1, keepdim=True)) * self.scale
        noisy = grad + (2 * u - 1) * spread
        return torch.where(_rows(byzantine, grad, grad.dim() - 1), noisy, grad)


class SignFlip(Attack):
    """Report ``scale · g`` with a negative scale (FedPG-BR's sign-flipping attackers send −2.5·g).

    :param scale: the multiplier (negative: ascent becomes descent)
    """

    name = "sign_flip"

    def __init__(self, scale: float = -2.5) -> None:
        self.scale = float(scale)

    def gradient(self, grad: torch.Tensor, byzantine: torch.Tensor, streams: RandomStreams) -> torch.Tensor:
        return torch.where(_rows(byzantine, grad, grad.dim() - 1), self.scale * grad, grad)


class ZeroGradient(Attack):
    """Report a zero gradient (a silent or crashed agent)."""

    name = "zero_gradient"

    def gradient(self, grad: torch.Tensor, byzantine: torch.Tensor, streams: RandomStreams) -> torch.Tensor:
        return torch.where(_rows(byzantine, grad, grad.dim() - 1), torch.zeros_like(grad), grad)


class RandomActionPolicy:
    """A policy that acts uniformly at random on Byzantine rows and like ``policy`` elsewhere.

    Log-probabilities (and everything but :meth:`sample`) are the wrapped policy's: the agent
    computes an honest-looking gradient of its own policy on actions it did not choose.
    Discrete actions are uniform over the actions; ``Box`` actions uniform in the bounds.
    """

    def __init__(self, policy: Any, byzantine: torch.Tensor) -> None:
        self._policy = policy
        self._byzantine = byzantine

    def __getattr__(self, name: str) -> Any:
        return getattr(self._policy, name)

    def kernel_rollout_plan(self, family: Any, params: Any) -> None:
        """No fast path: a fast rollout plan of the wrapped policy would sample its own actions."""
        return None

    def sample(self, theta: torch.Tensor, obs: torch.Tensor, streams: RandomStreams) -> torch.Tensor:
        action = self._policy.sample(theta, obs, streams)
        batch_dims = streams.keys.dim()
        space = self._policy.action_space
        if hasattr(space, "n"):
            u = streams.uniform(action.shape[batch_dims:], dtype=torch.float64)
            random = (u * int(space.n)).long().clamp(max=int(space.n) - 1).to(action.dtype)
        else:
            low = torch.as_tensor(space.low, dtype=action.dtype, device=action.device)
            high = torch.as_tensor(space.high, dtype=action.dtype, device=action.device)
            u = streams.uniform(action.shape[batch_dims:], dtype=action.dtype)
            random = low + (high - low) * u
        return torch.where(_rows(self._byzantine, action, batch_dims), random, action)


class RandomAction(Attack):
    """Act uniformly at random and report the (honestly computed) gradient of those trajectories."""

    name = "random_action"

    def policy(self, policy: Any, byzantine: torch.Tensor) -> Any:
        return RandomActionPolicy(policy, byzantine)


class RewardFlip(Attack):
    """Learn from negated rewards ``−r`` (the reported gradient then points to lower returns)."""

    name = "reward_flip"

    def trajectories(self, traj: Trajectories, byzantine: torch.Tensor) -> Trajectories:
        batch_dims = traj.rewards.dim() - 2
        return traj._replace(rewards=torch.where(_rows(byzantine, traj.rewards, batch_dims), -traj.rewards, traj.rewards))


#: every attack by name
ATTACKS: dict[str, type[Attack]] = {
    cls.name: cls for cls in (NoAttack, RandomNoise, SignFlip, ZeroGradient, RandomAction, RewardFlip)
}


def make_attack(attack: str | Attack | None) -> Attack:
    """An attack object from its name (``None`` or ``"none"``: no attack) or the object itself."""
    if attack is None:
        return NoAttack()
    if isinstance(attack, Attack):
        return attack
    if isinstance(attack, str) and attack in ATTACKS:
        return ATTACKS[attack]()
    raise ValueError(f"attack must be an Attack or one of {sorted(ATTACKS)}, got {attack!r}")


class AttackedEstimator(GradientEstimator):
    """Wrap a gradient estimator so that the agents marked ``byzantine`` run ``attack``.

    The wrapped estimator samples through a sampler whose policy is ``attack.policy(...)`` and
    whose trajectories pass through ``attack.trajectories``; its direction passes through
    ``attack.gradient``, with noise from :func:`attack_streams` of the sampler's streams.
    Used to attack FedAvg-PG's local steps: ``model.estimator = AttackedEstimator(model.estimator, ...)``.

    :param estimator: the honest estimator
    :param attack: the attack
    :param byzantine: boolean mask over agents ``[n]`` (or broadcastable to the batch)
    """

    def __init__(self, estimator: GradientEstimator, attack: Attack | str, byzantine: torch.Tensor) -> None:
        super().__init__(estimator.policy, estimator.gamma)
        self.inner = estimator
        self.attack = make_attack(attack)
        self.byzantine = torch.as_tensor(byzantine, dtype=torch.bool)
        self.name = f"{estimator.name}+{self.attack.name}"
        self._noise: RandomStreams | None = None

    @property
    def trajectories_per_step(self) -> int:
        return self.inner.trajectories_per_step

    def __call__(self, sampler: Any, theta: torch.Tensor) -> torch.Tensor:
        batch = theta.shape[:-1]
        byzantine = torch.broadcast_to(self.byzantine.to(theta.device), batch)
        mask_rows = byzantine.reshape(*batch, 1)  # broadcast over the trajectory axis too
        attacked = sampler.with_policy(self.attack.policy(sampler.policy, mask_rows))

        def draw(th: torch.Tensor, m: int) -> Trajectories:
            return self.attack.trajectories(attacked(th, m), byzantine)

        grad = self.inner(draw, theta)
        if self._noise is None or tuple(self._noise.batch_shape) != tuple(batch):
            self._noise = attack_streams(sampler.streams)
        return self.attack.gradient(grad, byzantine, self._noise)
