"""A SparkSession set up for lakelog: build a local one, or attach lakelog to one you have."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from log_tables.layout import Layout

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

CONF_DATA_DIR = "spark.lakelog.dataDir"
CONF_WAREHOUSE = "spark.lakelog.warehouse"

# Settings lakelog relies on: TIMESTAMP_MICROS gives Parquet min/max stats on timestamps
# (INT96 has none), UTC keeps timestamps as stored, Arrow makes Python sources fast.
SESSION_CONF = {
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.shuffle.partitions": "8",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.sources.partitionColumnTypeInference.enabled": "true",
}


def lakelog_session(data_dir: str | os.PathLike[str] = "lakelog-data",
                    warehouse: str | None = None, *, master: str | None = None,
                    app_name: str = "lakelog", conf: dict[str, str] | None = None
                    ) -> SparkSession:
    """Build (or reuse) a SparkSession ready for lakelog; ``master`` defaults to ``local[*]``."""
    from pyspark.sql import SparkSession

    # Python workers must run the interpreter lakelog is installed in.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    builder = builder.master(master or os.environ.get("LAKELOG_SPARK_MASTER", "local[*]"))
    for key, value in {**SESSION_CONF, "spark.driver.memory": "2g", **(conf or {})}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return attach(spark, data_dir, warehouse)


def attach(spark: SparkSession, data_dir: str | os.PathLike[str] = "lakelog-data",
           warehouse: str | None = None) -> SparkSession:
    """Point an existing session at a lakelog data directory and warehouse, and register
    the ``lakelog`` data source."""
    from log_tables.spark.source import register_source

    layout = Layout.of(data_dir, warehouse)
    for key, value in SESSION_CONF.items():
        if key.startswith("spark.sql.") and not key.startswith("spark.sql.shuffle"):
            spark.conf.set(key, value)
    spark.conf.set(CONF_DATA_DIR, layout.data_dir)
    spark.conf.set(CONF_WAREHOUSE, layout.warehouse)
    register_source(spark, layout)
    return spark


def session_layout(spark: SparkSession) -> Layout:
    """The layout a session was attached to."""
    data_dir = spark.conf.get(CONF_DATA_DIR, None)
    if data_dir is None:
        raise RuntimeError("this SparkSession is not attached to lakelog: call "
                           "log_tables.spark.session.attach(spark, data_dir) first")
    return Layout(data_dir, spark.conf.get(CONF_WAREHOUSE, None) or Layout.of(data_dir).warehouse)
