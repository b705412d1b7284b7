"""``python -m fedrl_algos.cli``: the ``fedrl`` command."""

from fedrl_algos.cli import run

run()
