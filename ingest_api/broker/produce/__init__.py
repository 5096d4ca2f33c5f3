"""Produce by step: ``planner`` (check records, cut them into runs), ``appender`` (a
partition's runs into few batches), ``service`` (the request, its appends and its acks);
``request`` is what a front hands in (the records as columns), ``cuts`` cuts them into
runs, ``runs`` holds the values they pass along."""

from ingest_api.broker.produce.request import ProducerColumns, ProduceRequest
from ingest_api.broker.produce.runs import ProduceResult
from ingest_api.broker.produce.service import Acks, ProduceService

__all__ = ["Acks", "ProduceRequest", "ProduceResult", "ProduceService", "ProducerColumns"]
