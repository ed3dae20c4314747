"""The data pipeline on Apache Spark: the `courier` data source and one module per job
(analytics, export, replay, ingest)."""
