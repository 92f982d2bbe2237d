from airflow.providers.standard.operators.bash import BashOperator
from airflow.sdk import DAG

with DAG("smoke_tmp", schedule=None):
    BashOperator(task_id="hi", bash_command="echo hello-from-bash")
