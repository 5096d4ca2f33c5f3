"""The bottom floor: the log itself, knowing nothing of brokers, clusters or HTTP.

The root holds what every floor shares: records and their Arrow schema (``records``),
topic configs and the registry, the data directory's layout, the one error table, the
partitioner and the clock. Its rooms build upwards, each importing only those below
(``tests/log_tables/test_rooms.py``): ``hot/`` the partition logs on local disk and the
one bound of every read, ``cold/`` the Delta tier and reads across both tiers,
``spark/`` Spark reading the log. Every other package imports this one; it imports none
of them.
"""
