"""The hot tier: each partition's log on local disk, written by one broker process.

``PartitionLog`` (appends and their checks, the idempotent producers' state, leader
epochs, the high watermark and ``readable_end``, the one bound every reader asks for)
holds a ``LocalLog`` (the segments: roll, flush, truncate, drop) over ``LogSegment``
files with their offset and time indexes; ``recovery`` decides what of a directory is
trusted; ``LogManager`` opens every partition of a data directory and issues producer
ids through a ``ProducerIds`` chosen when it is built; ``hot_reader`` reads the
segment files from other processes (the jobs, Spark).
"""
