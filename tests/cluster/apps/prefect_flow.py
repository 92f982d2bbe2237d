"""A flow-run process of tests/cluster/test_adapters_on_pods.py: a Prefect flow whose one task
runs gang.py's ``allreduce_steps`` on the kubernetes target (the default client: ``$KUBECONFIG``).

``python prefect_flow.py STEPS INTERVAL`` runs a new flow run (its id written to
``$FLOW_RUN_ID_FILE`` as it starts); ``python prefect_flow.py STEPS INTERVAL FLOW_RUN_ID``
executes that flow run again, as its infrastructure does after the process died. Either
prints ``RESULT <the step result as JSON>`` at the end."""

# No `from __future__ import annotations`: Prefect reads the flow's annotations.
import json
import os
import sys
from pathlib import Path

import prefect.runtime
from prefect import flow
from torchstep_prefect import app_task

GANG = f"{Path(__file__).resolve().parent / 'gang.py'}:allreduce_steps"
train = app_task(GANG, target="kubernetes", cfg={"namespace": os.environ["TORCHSTEP_NAMESPACE"]})


@flow
def pipeline(steps: int, interval: float) -> dict:
    Path(os.environ["FLOW_RUN_ID_FILE"]).write_text(str(prefect.runtime.flow_run.id))
    return train(steps=steps, interval=interval)


def main() -> None:
    steps, interval = int(sys.argv[1]), float(sys.argv[2])
    if len(sys.argv) > 3:
        from prefect.client.orchestration import get_client
        from prefect.flow_engine import run_flow

        with get_client(sync_client=True) as client:
            run = client.read_flow_run(sys.argv[3])
        result = run_flow(pipeline, flow_run=run, parameters={"steps": steps, "interval": interval})
    else:
        result = pipeline(steps=steps, interval=interval)
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
