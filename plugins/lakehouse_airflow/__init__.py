"""Airflow parts of the lakehouse: the job factory, the stream health sensor, the UI views.

Airflow puts ``plugins/`` on ``sys.path``; DAG files import from here and stay wiring only.
Nothing here imports Spark: jobs run in ``spark-submit``-ted drivers.
"""
