"""Transactions (Kafka's KIP-98, hardened by KIP-447 and KIP-890): the coordinator of a
transactional id, its durable state, and the markers that end a transaction in every
partition it wrote.

``state`` has a transaction's metadata and its states; ``state_log`` keeps them durable
in ``__transaction_state``, one partition per coordinator slot; ``markers`` writes the
COMMIT and ABORT markers; ``coordinator`` runs the protocol (init, add partitions, add a
group's offsets, end, time out) and tells the produce path whether a transactional write
belongs to an open transaction.
"""
