"""A Jepsen-style nemesis for the cluster: real brokers on hosts of their own, the
project's clients, a seeded random mix of faults, and a checker that counts."""
