"""Bad run options (``cfg``) every adapter must refuse where they are written (issue 24):
``(target, cfg, field named in the error)``. Shared by the KFP, Prefect and Airflow tests."""

BAD_CFG = [
    ("local", "timeout=60", "cfg"),
    ("local", {"timout": 60}, "cfg['timout']"),
    ("local", {"timeout": -1}, "cfg['timeout']"),
    ("local", {"timeout": float("nan")}, "cfg['timeout']"),
    ("local", {"grace_period": "soon"}, "cfg['grace_period']"),
    ("local", {"run_id": "mine"}, "cfg['run_id']"),
    ("kubernetes", {"namespace": "Bad NS"}, "cfg['namespace']"),
    ("kubernetes", {"timeout": 60}, "cfg['timeout']"),
    ("kubernetes", {"active_deadline": -5}, "cfg['active_deadline']"),
]
