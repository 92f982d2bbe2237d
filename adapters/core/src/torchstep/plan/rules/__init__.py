"""The rule book behind :func:`torchstep.build_plan`: one module of plain functions per
concern, each taking a :class:`~torchstep.plan.rules.record.Recorder` first and recording
one decision per field (honoured / ignored / rejected), with the per-target wording of
its decisions in one ``BECOMES`` table beside the rules.

- :mod:`~torchstep.plan.rules.command`: name, image, entrypoint, args, env, macros;
- :mod:`~torchstep.plan.rules.replicas`: num_replicas, min_replicas, processes per replica;
- :mod:`~torchstep.plan.rules.resources`: resource, mounts, port_map;
- :mod:`~torchstep.plan.rules.retry`: max_retries, retry_policy, the step's retries;
- :mod:`~torchstep.plan.rules.metadata`: role metadata, options, secrets, newer fields.
"""
