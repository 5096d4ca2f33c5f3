"""Kafka's binary protocol: a second front of the broker core (``ingest_api.broker``),
beside the HTTP one, so that Kafka's own clients (librdkafka, kafka-python, aiokafka,
kcat, the Java clients) produce to and fetch from lakelog unchanged.

Messages are kio's (generated from Kafka's own message definitions); record batches are
read and written with aiokafka's record codec (compression included). What the
listener serves so far is in docs/kafka-protocol.md.
"""
