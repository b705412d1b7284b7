"""Byzantine attacks as small strategy objects (the failure models of FedPG-BR, Fan et al. 2021).

An attack acts at up to four points of an agent's round, and only on the rows its boolean mask
``byzantine`` marks (broadcast against the batch ``[*R, n]``); honest rows pass unchanged:

* :meth:`Attack.policy` — the policy the agent *acts* with (random actions);
* :meth:`Attack.trajectories` — the data the agent *learns* from (flipped or shuffled rewards);
* :meth:`Attack.gradient` — what the agent *reports* (noise, flipped sign, zeros, a colluding
  filter-aware vector);
* :meth:`Attack.spread` — the spread of its per-trajectory estimates it *reports* alongside
  (FedPG-BR's ``sigma="auto"`` sets σ from these reports, so a liar can forge it).

Every attack draws its random numbers from the streams it is handed (never from global RNG), and
draws the same amount for every row, so honest agents' numbers never depend on who attacks.
:class:`AttackedEstimator` applies an attack to any :class:`~fedrl_algos.core.GradientEstimator`
(e.g. FedAvg-PG's local steps), :func:`make_attack` builds one by name.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch

from fedrl_algos.core.directions import GradientEstimator
from fedrl_algos.core.trajectories import Trajectories
from fedrl_envs.rng import RandomStreams, mix64
from fedrl_envs.validation import check_real

__all__ = [
    "ATTACKS",
    "Attack",
    "NoAttack",
    "RandomNoise",
    "SignFlip",
    "ZeroGradient",
    "RandomAction",
    "RewardFlip",
    "RandomReward",
    "FedScsPGAttack",
    "ForgedSpread",
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

    #: whether the Byzantine agents pool what they know (their hooks read other agents' rows), so
    #: that one agent alone, e.g. a Flower client, cannot carry out the attack
    colluding: bool = False

    #: registry name (``random_noise``, ``sign_flip``, ...)
    name: ClassVar[str] = "none"

    def policy(self, policy: Any, byzantine: torch.Tensor) -> Any:
        """The policy the agents act with."""
        return policy

    def trajectories(self, traj: Trajectories, byzantine: torch.Tensor, streams: RandomStreams | None = None) -> Trajectories:
        """The trajectories ``[*B, m, T, ...]`` the agents compute their gradients from
        (``streams``, batch shape ``B``: for attacks that draw random numbers here)."""
        return traj

    def gradient(self, grad: torch.Tensor, byzantine: torch.Tensor, streams: RandomStreams) -> torch.Tensor:
        """The gradients ``[*B, d]`` the agents report (``streams`` has batch shape ``B``).

        Where ``B`` has an agent axis it is the last one (``[*R, n]``), so that colluding attacks
        (:class:`FedScsPGAttack`) can read the other Byzantine agents' gradients of the same run.
        """
        return grad

    def spread(self, spread: torch.Tensor, byzantine: torch.Tensor, streams: RandomStreams) -> torch.Tensor:
        """The spreads ``[*B]`` the agents report with their gradients (FedPG-BR's ``sigma="auto"``)."""
        return spread

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({fields})"


class NoAttack(Attack):
    """No attack."""


class RandomNoise(Attack):
    """Report the gradient plus uniform noise: ``g + U(−1, 1)·scale·(max g − min g)`` per coordinate.

    The noise is scaled to each gradient's own range, so it stays large whatever the reward scale.

    :param scale: noise amplitude in units of the gradient's range, finite ``> 0`` (FedPG-BR uses 3)
    """

    name = "random_noise"

    def __init__(self, scale: float = 3.0) -> None:
        self.scale = check_real("scale", scale, 0, low_inclusive=False)

    def gradient(self, grad: torch.Tensor, byzantine: torch.Tensor, streams: RandomStreams) -> torch.Tensor:
        u = streams.uniform((grad.shape[-1],), dtype=grad.dtype)
        spread = (grad.amax(-1, keepdim=True) - grad.amin(-1, keepdim=True)) * self.scale
        noisy = grad + (2 * u - 1) * spread
        return torch.where(_rows(byzantine, grad, grad.dim() - 1), noisy, grad)


class SignFlip(Attack):
    """Report ``scale · g`` with a negative scale (FedPG-BR's sign-flipping attackers send −2.5·g).

    :param scale: the multiplier, a finite number (negative: ascent becomes descent)
    """

    name = "sign_flip"

    def __init__(self, scale: float = -2.5) -> None:
        self.scale = check_real("scale", scale)

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

    def trajectories(self, traj: Trajectories, byzantine: torch.Tensor, streams: RandomStreams | None = None) -> Trajectories:
        batch_dims = traj.rewards.dim() - 2
        return traj._replace(rewards=torch.where(_rows(byzantine, traj.rewards, batch_dims), -traj.rewards, traj.rewards))


class RandomReward(Attack):
    """Learn from each episode's rewards in a random order (the reference code's "random reward").

    Every trajectory's rewards of its alive steps (a prefix of the time axis) are permuted
    uniformly at random before the returns are computed, so the agent credits the wrong actions.
    Rewards that are the same at every step (CartPole's +1) are left exactly as they were: there
    the attack is honest by construction.
    """

    name = "random_reward"

    def trajectories(self, traj: Trajectories, byzantine: torch.Tensor, streams: RandomStreams | None = None) -> Trajectories:
        if streams is None:
            raise ValueError("RandomReward needs random streams (the agents' attack streams) to shuffle rewards")
        batch_dims = traj.rewards.dim() - 2
        u = streams.uniform(tuple(traj.rewards.shape[batch_dims:]), dtype=torch.float64)  # [*B, m, T]
        # Dead steps sort last (key 2 > any uniform), so the alive prefix is permuted among itself.
        keys = torch.where(traj.mask > 0, u, torch.full_like(u, 2.0))
        order = torch.argsort(keys, dim=-1, stable=True)
        shuffled = torch.gather(traj.rewards, -1, order)
        return traj._replace(rewards=torch.where(_rows(byzantine, traj.rewards, batch_dims), shuffled, traj.rewards))


class FedScsPGAttack(Attack):
    """The filter-aware colluding attack of FedPG-BR's experiments ("FedScsPG-attack").

    The Byzantine agents of a run pool their honest gradients, estimate ``2σ`` as the largest
    distance between two of them and their mean ``ḡ``, and all report the same vector
    ``ḡ + (scale/2)·2σ̂·r`` with ``r`` a random unit direction (uniform in ``[−1, 1]^d``, then
    normalized; one per run and round, shared by the colluders). Identical reports form their own
    tight cluster, placed ``scale·σ̂`` away from the honest mean: outside a filter radius of a few
    σ̂ only when ``scale`` is large enough. The agent axis must be the last batch axis.

    :param scale: the offset in units of σ̂, finite ``>= 0`` (the reference code uses 3)
    """

    name = "fedscspg"
    colluding = True

    def __init__(self, scale: float = 3.0) -> None:
        self.scale = check_real("scale", scale, 0)

    def gradient(self, grad: torch.Tensor, byzantine: torch.Tensor, streams: RandomStreams) -> torch.Tensor:
        mask = _rows(byzantine, grad, grad.dim() - 1)  # [*B, 1]
        bad = mask.squeeze(-1)  # [*R, n]
        w = bad.to(grad.dtype).unsqueeze(-1)
        count = w.sum(-2, keepdim=True)
        mean = (w * grad).sum(-2, keepdim=True) / count.clamp(min=1)  # [*R, 1, d]
        masked = torch.where(mask, grad, mean)  # honest rows at the mean: never the largest distance
        two_sigma = torch.cdist(masked, masked, compute_mode="donot_use_mm_for_euclid_dist").amax((-1, -2)).unsqueeze(-1).unsqueeze(-1)
        u = 2 * streams.uniform((grad.shape[-1],), dtype=grad.dtype) - 1  # every row draws: honest streams stay aligned
        first = torch.argmax(bad.to(torch.int8), dim=-1, keepdim=True).unsqueeze(-1).expand(*grad.shape[:-2], 1, grad.shape[-1])
        direction = torch.gather(u, -2, first)  # the first colluder's draw, shared
        direction = direction / direction.norm(dim=-1, keepdim=True).clamp(min=torch.finfo(grad.dtype).tiny)
        forged = mean + direction * two_sigma * (self.scale / 2)
        return torch.where(mask, forged.expand_as(grad), grad)


class ForgedSpread(Attack):
    """Another attack's gradient with a forged reported spread: ``factor ×`` the honest one.

    FedPG-BR's ``sigma="auto"`` takes the ``(1 − α)``-quantile of the reported spreads: a huge
    factor tries to widen the filter so that the attack's gradients pass; a tiny one to narrow
    it so that honest agents are rejected (and the wider 2σ fallback decides).

    :param factor: multiplier of the honest spread, finite ``> 0``
    :param attack: the attack whose policy, trajectories and gradient the agent also applies
    :param name: registry name
    """

    name = "forged_spread"

    def __init__(self, factor: float = 1e3, attack: Attack | str | None = "sign_flip", name: str | None = None) -> None:
        self.factor = check_real("factor", factor, 0, low_inclusive=False)
        self.attack = make_attack(attack)
        if name is not None:
            self.name = name

    @property
    def colluding(self) -> bool:  # type: ignore[override]
        return self.attack.colluding

    def policy(self, policy: Any, byzantine: torch.Tensor) -> Any:
        return self.attack.policy(policy, byzantine)

    def trajectories(self, traj: Trajectories, byzantine: torch.Tensor, streams: RandomStreams | None = None) -> Trajectories:
        return self.attack.trajectories(traj, byzantine, streams)

    def gradient(self, grad: torch.Tensor, byzantine: torch.Tensor, streams: RandomStreams) -> torch.Tensor:
        return self.attack.gradient(grad, byzantine, streams)

    def spread(self, spread: torch.Tensor, byzantine: torch.Tensor, streams: RandomStreams) -> torch.Tensor:
        spread = self.attack.spread(spread, byzantine, streams)
        return torch.where(_rows(byzantine, spread, spread.dim()), spread * self.factor, spread)


class HugeSpread(ForgedSpread):
    """Sign-flipped gradients (−2.5·g) reported with 1000× the honest spread."""

    name = "huge_spread"

    def __init__(self) -> None:
        super().__init__(1e3, "sign_flip")


class TinySpread(ForgedSpread):
    """Sign-flipped gradients (−2.5·g) reported with 1/1000 of the honest spread."""

    name = "tiny_spread"

    def __init__(self) -> None:
        super().__init__(1e-3, "sign_flip")


#: every attack by name
ATTACKS: dict[str, type[Attack]] = {
    cls.name: cls
    for cls in (NoAttack, RandomNoise, SignFlip, ZeroGradient, RandomAction, RewardFlip, RandomReward, FedScsPGAttack, HugeSpread, TinySpread)
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


def _bool_mask(name: str, value: Any) -> torch.Tensor:
    """``value`` (a bool tensor, NumPy bool array or nested sequence of bools) as a bool tensor; ``TypeError``
    naming ``name`` for anything else, agent indices and 0/1 integers included (never guessed from the values)."""
    if isinstance(value, torch.Tensor):
        mask = value.detach()
    elif isinstance(value, str | bytes):
        mask = None
    else:
        try:
            array = np.asarray(value)
        except ValueError:  # ragged
            raise ValueError(f"{name} must be a rectangular boolean mask over agents, got {value!r}") from None
        mask = torch.from_numpy(array.copy()) if array.dtype == np.bool_ else None  # a copy: views may have negative strides
    if mask is None or mask.dtype != torch.bool:
        raise TypeError(
            f"{name} must be a boolean mask over agents (a bool tensor, NumPy bool array or list of bools), got "
            f"{type(value).__name__} {value!r}: to mark agents by index, pass a boolean mask over agents built as "
            f"mask = torch.zeros(n_agents, dtype=torch.bool); mask[indices] = True"
        )
    return mask


class AttackedEstimator(GradientEstimator):
    """Wrap a gradient estimator so that the agents marked ``byzantine`` run ``attack``.

    The wrapped estimator samples through a sampler whose policy is ``attack.policy(...)`` and
    whose trajectories pass through ``attack.trajectories``; its direction passes through
    ``attack.gradient``, with noise from :func:`attack_streams` of the sampler's streams.
    Used to attack FedAvg-PG's local steps: ``model.estimator = AttackedEstimator(model.estimator, ...)``.

    :param estimator: the honest estimator
    :param attack: the attack
    :param byzantine: boolean mask over agents ``[n]`` (or broadcastable to the batch): a bool tensor, a
        NumPy bool array or a (nested) sequence of bools; agent indices are a ``TypeError`` (build the mask:
        ``mask = torch.zeros(n, dtype=torch.bool); mask[indices] = True``)
    """

    #: the Byzantine mask is over the federation's agents ``[n]``
    per_agent_state: ClassVar[bool] = True

    def __init__(self, estimator: GradientEstimator, attack: Attack | str, byzantine: torch.Tensor) -> None:
        byzantine = _bool_mask("byzantine", byzantine)
        super().__init__(estimator.policy, estimator.gamma)
        self.inner = estimator
        self.attack = make_attack(attack)
        self.byzantine = byzantine
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

        if self._noise is None or tuple(self._noise.batch_shape) != tuple(batch):
            self._noise = attack_streams(sampler.streams)
        noise = self._noise

        def draw(th: torch.Tensor, m: int) -> Trajectories:
            return self.attack.trajectories(attacked(th, m), byzantine, noise)

        grad = self.inner(draw, theta)
        return self.attack.gradient(grad, byzantine, noise)
