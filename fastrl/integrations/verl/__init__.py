"""fastrl as a verl rollout backend (``actor_rollout_ref.rollout.name=fastrl``).

Modules: ``options`` (the ``custom.fastrl.*`` keys), ``requests`` (verl's sampling dicts and outputs), ``server``
(the Ray server actor), ``drafter_hub`` (merging co-trained drafters across servers), ``replica`` (the
``RolloutReplica``), ``adapter`` (the ``BaseRollout`` that syncs weights), ``plugin`` (registration with verl).
Only ``options`` and ``requests`` import without verl installed.
"""
