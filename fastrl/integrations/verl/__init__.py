"""fastrl as a verl rollout backend (``actor_rollout_ref.rollout.name=fastrl``).

Modules: ``options`` (the ``custom.fastrl.*`` keys), ``requests`` (verl's sampling dicts and outputs), ``server``
(the Ray server actor) and ``server_report``, ``drafter_hub`` (merging co-trained drafters across servers),
``replica`` (the ``RolloutReplica``), ``adapter`` (the ``BaseRollout`` that syncs weights), ``plugin``
(registration with verl), ``local`` (verl's agent-loop rollout on a local CPU Ray, for tests and the smoke run).
Only ``options`` and ``requests`` import without verl installed.
"""
