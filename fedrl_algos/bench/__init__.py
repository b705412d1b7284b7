"""``fedrl bench``: throughput benchmarks, each next to its baseline measured in the same process.

One module per target (``fedrl bench <target>``): :mod:`.envs` (the federated env against NumPy and
Gymnasium), :mod:`.algos` (a training round batched against looped), :mod:`.vector` (CartPole and
Pendulum against Gymnasium, gymnax and EnvPool), :mod:`.training` (whole training rounds against the
bare env), :mod:`.reference` (against the papers' reference implementations), :mod:`.single` (one
single-env step), :mod:`.flower` (Flower's simulation against one process), :mod:`.memory` (peak
RSS of rollouts), :mod:`.mujoco` (against SB3's PPO on MuJoCo) and :mod:`.kernels` (compiled
against torch kernels). Each module has an ``add_<target>_target(targets)`` that adds its parser;
:data:`TARGETS` lists them and :mod:`fedrl_algos.cli.bench` builds ``fedrl bench`` from it, giving every
target ``--background-load N`` (:mod:`.background_load`). The targets are imported only when the
command line is built, so importing ``fedrl_algos`` imports none of them.
"""

from __future__ import annotations

__all__ = ["TARGETS"]

#: the ``fedrl bench`` targets in the order of ``fedrl bench --help``: target name -> module of
#: :mod:`fedrl_algos.bench` with an ``add_<target>_target(targets)`` function
TARGETS: dict[str, str] = {
    "envs": "envs",
    "algos": "algos",
    "vector": "vector",
    "training": "training",
    "reference": "reference",
    "single": "single",
    "flower": "flower",
    "memory": "memory",
    "mujoco": "mujoco",
    "kernels": "kernels",
}
