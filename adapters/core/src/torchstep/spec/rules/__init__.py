"""The rule book behind :func:`torchstep.build_plan`: one module of plain functions per
concern, each taking a :class:`~torchstep.spec.rules.record.Recorder` first and recording
one decision per field (honoured / ignored / rejected), with the per-target wording of
its decisions in one ``BECOMES`` table beside the rules.

- :mod:`~torchstep.spec.rules.command`: name, image, entrypoint, args, env, macros;
- :mod:`~torchstep.spec.rules.replicas`: num_replicas, min_replicas, processes per replica;
- :mod:`~torchstep.spec.rules.resources`: resource, mounts, port_map;
- :mod:`~torchstep.spec.rules.retry`: max_retries, retry_policy, the step's retries;
- :mod:`~torchstep.spec.rules.metadata`: role metadata, options, secrets, newer fields.
"""
