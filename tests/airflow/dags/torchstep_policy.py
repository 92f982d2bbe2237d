"""The generic DAG of ``torchx run -s airflow`` under the deployment's policy, for
tests/airflow/test_torchx_policy.py (dag.test(), a stranger's confs)."""

from torchstep_airflow.torchx_dag import torchx_dag

dag = torchx_dag("torchstep_policy_test")
