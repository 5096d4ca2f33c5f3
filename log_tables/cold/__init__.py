"""The cold tier: one Delta table per topic, holding what was tiered out of the hot logs.

The table, its rows and app transactions (``table``, ``rows``), guarded commits
(``commit``), the broker's view of it (``tiered_storage``: reads below the hot tier,
DeleteRecords, retiring tiered hot segments) and, for other processes, offset ranges
and bounds across both tiers (``topic_reader``). Imports ``hot/``, never ``spark/``.
"""
